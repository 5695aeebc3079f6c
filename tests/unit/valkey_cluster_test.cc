// The cluster slot of a key, as Valkey computes it (expected values from CLUSTER KEYSLOT).

#include <doctest/doctest.h>

#include "valkey/cluster_client.h"

using sluice::valkey::keySlot;

TEST_SUITE("valkey cluster") {
  TEST_CASE("keySlot: CRC16 of the key, or of its first non-empty hash tag") {
    CHECK(keySlot("foo") == 12182);
    CHECK(keySlot("somekey") == 11058);
    CHECK(keySlot("{user1000}.following") == 3443);
    CHECK(keySlot("user1000") == 3443);
    CHECK(keySlot("{}foo") == 9500);          // an empty tag: the whole key
    CHECK(keySlot("foo{}{bar}") == 8363);     // the first "{" and the first "}" after it
    CHECK(keySlot("foo{{bar}}zap") == 4015);  // tag "{bar"
    CHECK(keySlot("foo{bar}{zap}") == 5061);  // tag "bar"
    CHECK(keySlot("{rl}:v1:per_ip:{127.0.0.1}") == keySlot("rl"));
    CHECK(keySlot("{rl}:v1:per_ip:{127.0.0.1}") == 785);
    CHECK(keySlot("123456789") == (0x31c3 & 16383));  // the CRC16-CCITT check value
    CHECK(keySlot("") == 0);
    CHECK(keySlot("\xff\x80\x01") == keySlot("{\xff\x80\x01}"));  // bytes above 0x7f
  }
}
