#pragma once

// The decide engine: lua/decide.lua and lua/{fixed_window,sliding_window,sliding_log,
// token_bucket,concurrency}.lua done natively, step for step (the same keys, stored formats,
// double arithmetic, expiries, replies and error texts; see the .cc). Each command function
// takes the arguments of its FCALL after the function name (numkeys, keys, args) and writes
// the identical reply.

#include "module_api.h"

namespace sluice::engine {

int decideCommand(vm::Ctx* ctx, vm::String** argv, int argc);
int undoCommand(vm::Ctx* ctx, vm::String** argv, int argc);
int leaseCommand(vm::Ctx* ctx, vm::String** argv, int argc);
int peekCommand(vm::Ctx* ctx, vm::String** argv, int argc);

// Seeds the expiry spread's generator.
void seed(unsigned long long seed);

}  // namespace sluice::engine
