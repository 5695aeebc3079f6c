#pragma once

// The request line's rules, one for both codecs: what HTTP/1.1's parser (llhttp, strict)
// refuses, an HTTP/2 request is refused for too, so that a method or a target means one thing
// to the routes, the limits and the upstream whichever protocol carried it.

#include <optional>
#include <string_view>

#include "http/message.h"

namespace sluice::http {

// One of the methods HTTP/1.1 requests may carry (llhttp's list, in its exact spelling:
// "POST", "M-SEARCH"; not "post" or "Post", which frameworks would serve as POST while the
// routes and the limits saw another method).
bool knownMethod(std::string_view method);

// Every byte of a request-target is visible ASCII (0x21-0x7E): no space, control, DEL or
// byte 0x80-0xFF (which an upstream that decodes UTF-8 and splits on Unicode whitespace
// would read as another path than the routes saw).
bool visibleAscii(std::string_view target);

// Why a request is refused before it is routed: the status to answer and why.
struct Refusal {
  int status;
  const char* why;
};

// The checks both codecs make of a request head once its Host is known (an HTTP/2 stream's
// :authority is its Host): CONNECT is not proxied (405); one Host field, which an HTTP/1.0
// request may leave out, and a host[:port] in it (400).
std::optional<Refusal> checkRequestHead(const MessageHead& head);

}  // namespace sluice::http
