#pragma once

// The protobuf wire format (protobuf.dev/programming-guides/encoding), as much of it as the
// rate limit service's messages use: varints, length-delimited fields (strings, bytes,
// embedded messages), and skipping whatever else a newer peer sends (64- and 32-bit fields,
// unknown fields of any type). Our own rather than libprotobuf: the service reads one small
// request message and writes one response per call, with bounds of its own on every count and
// length; generated classes would bring protoc, Envoy's proto tree with its validate and udpa
// imports, and an arena per call for that.
//
// Reader never reads past its buffer and never allocates; a malformed input (a varint over 10
// bytes, a length past the end, a group, a field number 0) makes it fail, and it stays failed.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace sluice::rls::wire {

enum class WireType : uint8_t { Varint = 0, Fixed64 = 1, Length = 2, Fixed32 = 5 };

class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}

  // The next field's number and type; false at the end of the buffer or on malformed input
  // (then failed() says which).
  bool next();
  uint32_t field() const { return field_; }
  WireType type() const { return type_; }

  // The value of the field next() found, read as the type it has. Each returns false (and
  // fails the reader) when the field has another wire type or the value is malformed.
  bool varint(uint64_t& out);
  bool bytes(std::string_view& out);  // a string, bytes or an embedded message
  // Skips the value of a field it does not read.
  bool skip();

  bool failed() const { return failed_; }
  bool atEnd() const { return !failed_ && pos_ == data_.size(); }

 private:
  bool readVarint(uint64_t& out);
  bool fail() {
    failed_ = true;
    return false;
  }

  std::string_view data_;
  size_t pos_ = 0;
  uint32_t field_ = 0;
  WireType type_ = WireType::Varint;
  bool failed_ = false;
};

// Appends fields to a string. A field whose value is the type's default (0, "") is still
// written when asked: the callers leave out what proto3 leaves out.
class Writer {
 public:
  explicit Writer(std::string& out) : out_(out) {}

  void varint(uint32_t field, uint64_t value);
  void bytes(uint32_t field, std::string_view value);
  // An embedded message: begin() returns a mark, end() writes its length before it.
  size_t begin(uint32_t field);
  void end(size_t mark);

 private:
  void tag(uint32_t field, WireType type);
  void rawVarint(uint64_t value);

  std::string& out_;
};

// The bytes of a varint of `value` (1 to 10).
size_t varintSize(uint64_t value);

}  // namespace sluice::rls::wire
