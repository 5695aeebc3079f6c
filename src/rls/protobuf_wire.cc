#include "rls/protobuf_wire.h"

namespace sluice::rls::wire {

bool Reader::readVarint(uint64_t& out) {
  uint64_t value = 0;
  for (int shift = 0; shift < 70; shift += 7) {
    if (pos_ >= data_.size()) return fail();
    const auto byte = static_cast<uint8_t>(data_[pos_++]);
    // The tenth byte holds bit 63 only.
    if (shift == 63 && byte > 1) return fail();
    value |= static_cast<uint64_t>(byte & 0x7F) << shift;
    if ((byte & 0x80) == 0) {
      out = value;
      return true;
    }
  }
  return fail();
}

bool Reader::next() {
  if (failed_ || pos_ >= data_.size()) return false;
  uint64_t key = 0;
  if (!readVarint(key)) return false;
  const uint64_t field = key >> 3;
  const auto type = static_cast<uint8_t>(key & 7);
  // Field numbers are 1 .. 2^29 - 1; groups (3, 4) and types 6, 7 are not in proto3.
  if (field == 0 || field > 0x1FFFFFFF) return fail();
  if (type != 0 && type != 1 && type != 2 && type != 5) return fail();
  field_ = static_cast<uint32_t>(field);
  type_ = static_cast<WireType>(type);
  return true;
}

bool Reader::varint(uint64_t& out) {
  if (failed_ || type_ != WireType::Varint) return fail();
  return readVarint(out);
}

bool Reader::bytes(std::string_view& out) {
  if (failed_ || type_ != WireType::Length) return fail();
  uint64_t length = 0;
  if (!readVarint(length)) return false;
  if (length > data_.size() - pos_) return fail();
  out = data_.substr(pos_, static_cast<size_t>(length));
  pos_ += static_cast<size_t>(length);
  return true;
}

bool Reader::skip() {
  if (failed_) return false;
  switch (type_) {
    case WireType::Varint: {
      uint64_t ignored = 0;
      return readVarint(ignored);
    }
    case WireType::Length: {
      std::string_view ignored;
      return bytes(ignored);
    }
    case WireType::Fixed64:
      if (data_.size() - pos_ < 8) return fail();
      pos_ += 8;
      return true;
    case WireType::Fixed32:
      if (data_.size() - pos_ < 4) return fail();
      pos_ += 4;
      return true;
  }
  return fail();
}

size_t varintSize(uint64_t value) {
  size_t n = 1;
  while (value >= 0x80) {
    value >>= 7;
    ++n;
  }
  return n;
}

namespace {

// Writes the varint of `value` at `out` (room for 10 bytes); returns its size.
size_t encodeVarint(uint64_t value, char* out) {
  size_t n = 0;
  while (value >= 0x80) {
    out[n++] = static_cast<char>((value & 0x7F) | 0x80);
    value >>= 7;
  }
  out[n++] = static_cast<char>(value);
  return n;
}

}  // namespace

void Writer::rawVarint(uint64_t value) {
  char bytes[10];
  out_.append(bytes, encodeVarint(value, bytes));
}

void Writer::tag(uint32_t field, WireType type) {
  rawVarint((static_cast<uint64_t>(field) << 3) | static_cast<uint8_t>(type));
}

void Writer::varint(uint32_t field, uint64_t value) {
  tag(field, WireType::Varint);
  rawVarint(value);
}

void Writer::bytes(uint32_t field, std::string_view value) {
  tag(field, WireType::Length);
  rawVarint(value.size());
  out_.append(value);
}

size_t Writer::begin(uint32_t field) {
  tag(field, WireType::Length);
  return out_.size();
}

void Writer::end(size_t mark) {
  // The length goes before the message's bytes: they move up by its size (messages here are
  // small; one move per embedded message).
  char prefix[10];
  out_.insert(mark, prefix, encodeVarint(out_.size() - mark, prefix));
}

}  // namespace sluice::rls::wire
