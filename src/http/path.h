#pragma once

// Path normalization (RFC 3986 6.2), shared by the router (request paths) and the
// configuration loader (the paths routes are written with), so that both meet in one form.

#include <string>
#include <string_view>

namespace sluice::http {

// Decodes %XX of unreserved characters (RFC 3986 6.2.2.2); other escapes stay as sent, with
// upper-case hex. Fails (and says why) on a malformed escape or an encoded NUL.
bool decodeUnreserved(std::string_view in, std::string* out, std::string* error);

// A path that starts with '/' (already decoded) put in normal form: empty segments merged, as
// nginx's merge_slashes ("//a" is "/a"), then dot-segments resolved (RFC 3986 5.2.4) on what
// is left. With strip_params, the path parameters of each segment (";jsessionid=1", the part
// from the first ';') are dropped first, as servlet containers and Spring do, so that "..;"
// is a dot-segment there too. A trailing slash is kept. Fails when ".." climbs above the root.
bool normalizePath(std::string_view path, bool strip_params, std::string* out, std::string* error);

// True when normalizePath(decodeUnreserved(path), false) would give `path` back unchanged:
// it starts with '/' and has no %-escape, no empty segment but the last (a trailing slash),
// and no "." or ".." segment. Most requests' paths are: they skip both copies.
bool isNormalPath(std::string_view path);

// A path as routes compare it: without the trailing slash (but "/" stays "/").
std::string_view withoutTrailingSlash(std::string_view path);

}  // namespace sluice::http
