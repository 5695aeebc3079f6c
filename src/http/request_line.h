#pragma once

// The request line's rules, one for both codecs: what HTTP/1.1's parser (llhttp, strict)
// refuses, an HTTP/2 request is refused for too, so that a method or a target means one thing
// to the routes, the limits and the upstream whichever protocol carried it.

#include <string_view>

namespace sluice::http {

// One of the methods HTTP/1.1 requests may carry (llhttp's list, in its exact spelling:
// "POST", "M-SEARCH"; not "post" or "Post", which frameworks would serve as POST while the
// routes and the limits saw another method).
bool knownMethod(std::string_view method);

// Every byte of a request-target is visible ASCII (0x21-0x7E): no space, control, DEL or
// byte 0x80-0xFF (which an upstream that decodes UTF-8 and splits on Unicode whitespace
// would read as another path than the routes saw).
bool visibleAscii(std::string_view target);

}  // namespace sluice::http
