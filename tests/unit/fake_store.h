#pragma once

// A fake Valkey store (valkey::Store) for the tests of what sits on it (the decision batcher,
// admission): it keeps every call it is asked for, for the test to answer through the call's
// target.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "valkey/store.h"

namespace sluice::testing {

// Slots are the keys' first characters ("1:..." is in slot 1) with `digit_slots`, else every
// key is in slot 0. Counts what was asked, flushed and cancelled.
class FakeStore final : public sluice::valkey::Store {
 public:
  struct Call final : sluice::valkey::PendingCall {
    std::string command;
    std::string first_key;
    sluice::valkey::CallTarget* target = nullptr;
  };

  void start() override {}
  void stop() override {}
  sluice::valkey::PendingCall* callDecide(std::string command, std::string_view first_key,
                                          sluice::valkey::CallTarget* target) override {
    ++asked;
    if (refuse_calls > 0) {
      --refuse_calls;
      return nullptr;
    }
    auto call = std::make_unique<Call>();
    call->command = std::move(command);
    call->first_key = std::string(first_key);
    call->target = target;
    calls.push_back(std::move(call));
    return calls.back().get();
  }
  const std::string& decideFunction() const override { return function_; }
  unsigned slotOf(std::string_view key) const override {
    return digit_slots ? static_cast<unsigned>(key.front() - '0') : 0;
  }
  bool accepting() override { return accepts; }
  bool answersFor(std::string_view) override { return accepts && refuse_calls == 0; }
  void flush() override { ++flushes; }
  sluice::valkey::PendingCall* command(std::vector<std::string>,
                                       sluice::valkey::CallTarget*) override {
    return nullptr;
  }
  void cancel(sluice::valkey::PendingCall*) override { ++cancels; }

  std::vector<std::unique_ptr<Call>> calls;
  bool digit_slots = true;
  int refuse_calls = 0;  // the next calls refused (not connected)
  bool accepts = true;
  int asked = 0;
  int flushes = 0;
  int cancels = 0;

 private:
  std::string function_ = "decide_f";
};

}  // namespace sluice::testing
