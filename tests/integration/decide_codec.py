"""The decide function's calls and replies, made and read by Sluice's own codec (ScriptBatch,
DecisionReader and undoCommand of src/ratelimit/script_codec.h, and the library of
src/ratelimit/scripts.cc) through the sluice_codec tool (tests/tools/codec_tool.cc): Python
neither builds the call nor reads the reply's layout.

The tool is SLUICE_CODEC_BIN, else the sluice_codec beside SLUICE_BIN (default
<repo>/build/sluice): one process for the whole session, started at the first use. Without it
every use fails (it is built with the unit tests).

A limit is a dict: algorithm, limit, window_ms, and optionally burst (default: limit), cost (1),
count_denied (False), shadow (False), keep (the largest limit of the quotas that share its
keys; default: limit). A request is a list of (key, limit) pairs.

- decide_library(): (source, function) of the library the gateway loads.
- decide_command(requests): the FCALL of one call deciding these requests, in order;
  decide_keys(requests): its KEYS.
- decide_call(client, command): runs it (loading the library when the server lacks it).
- decide_reply(reply, requests) -> Decided(time_us, results): per request either
  (allowed, [(allowed, remaining, reset_ms, retry_ms) per limit]) or the error string of a
  request that failed; asserts the reply is whole (its time there, every part read, nothing
  left, no negative value). decided(reply, request): that of a call of one request, which must
  be decided.
- undo_command(limits_and_keys, at_us) / undo_call(client, limits_and_keys, at_us): the undo
  of what the call of time at_us charged to these (key, limit) pairs, each its cost.
- decide_commands(batches): decide_command() of many calls at once (benchmarks); both take
  function= to call another function the same way.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Iterable, NamedTuple, Optional

REPO = Path(__file__).resolve().parents[2]


def codec_bin() -> Path:
    if os.environ.get("SLUICE_CODEC_BIN"):
        return Path(os.environ["SLUICE_CODEC_BIN"])
    sluice = Path(os.environ.get("SLUICE_BIN", REPO / "build" / "sluice"))
    return sluice.parent / "sluice_codec"


class Codec:
    """One sluice_codec process: a JSON object per line each way."""

    def __init__(self, path: Path):
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise RuntimeError(f"{path}: no sluice_codec there (build it with the unit tests, "
                               "or set SLUICE_CODEC_BIN)")
        self.path = path
        self.proc = subprocess.Popen([str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, encoding="utf-8")
        self.lock = threading.Lock()

    def ask_many(self, questions: list) -> list:
        """The answers to these questions, in order (written by a thread while they are read:
        neither pipe fills up)."""
        with self.lock:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.path} exited ({self.proc.returncode})")
            lines = [json.dumps(q) + "\n" for q in questions]

            def write():
                try:
                    for line in lines:
                        self.proc.stdin.write(line)
                    self.proc.stdin.flush()
                except BrokenPipeError:
                    pass
            writer = threading.Thread(target=write, daemon=True)
            writer.start()
            answers = []
            for _ in lines:
                line = self.proc.stdout.readline()
                if not line:
                    raise RuntimeError(f"{self.path} ended without an answer "
                                       f"(exit {self.proc.wait(5)})")
                answers.append(json.loads(line))
            writer.join()
        for question, answer in zip(questions, answers):
            if "error" in answer:
                raise ValueError(f"sluice_codec refused {question!r}: {answer['error']}")
        return answers

    def ask(self, question: dict) -> dict:
        return self.ask_many([question])[0]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


_codec: Optional[Codec] = None
_library: Optional[tuple] = None


def codec() -> Codec:
    global _codec
    if _codec is None:
        _codec = Codec(codec_bin())
        atexit.register(_codec.close)
    return _codec


def decide_library() -> tuple:
    """(source, function name) of the function library the gateway loads (FUNCTION LOAD)."""
    global _library
    if _library is None:
        answer = codec().ask({"op": "library"})
        _library = (answer["source"], answer["function"])
    return _library


def _limits(request: Iterable[tuple]) -> list:
    return [{**limit, "key": key} for key, limit in request]


def _encode(requests: Iterable, function: Optional[str] = None) -> dict:
    question = {"op": "encode", "requests": [_limits(r) for r in requests]}
    if function is not None:
        question["function"] = function
    return question


def decide_command(requests: Iterable, function: Optional[str] = None) -> list:
    """The FCALL (command and arguments) deciding these requests ([[(key, limit)]]) in one call
    (of the library's function, or of `function`, called the same way)."""
    return codec().ask(_encode(requests, function))["command"]


def decide_commands(batches: Iterable, function: Optional[str] = None) -> list:
    """decide_command() of each batch of requests, asked at once."""
    return [a["command"] for a in codec().ask_many([_encode(b, function) for b in batches])]


def decide_keys(requests: Iterable) -> list:
    """The KEYS of that call: every key once, in order of first use."""
    return codec().ask(_encode(requests))["keys"]


def engine_command(command: list) -> list:
    """The command as the suites' engine sends it (harness/valkey.py ENGINE): the FCALL, or on
    the module the module's command of the same arguments (src/valkey/engine.h)."""
    from harness.valkey import ENGINE
    if ENGINE != "module" or not command or str(command[0]).upper() != "FCALL":
        return list(command)
    name = str(command[1])
    function = decide_library()[1]
    suffix = name[len(function):] if name.startswith(function) else None
    native = {"": "SLUICE.DECIDE", "_undo": "SLUICE.UNDO", "_lease": "SLUICE.LEASE",
              "_peek": "SLUICE.PEEK"}.get(suffix)
    return [native, *command[2:]] if native else list(command)


def decide_call(client, command: list):
    """Runs a decide_command() (loading the library when the server lacks it); the raw reply.
    On the module engine, the module's command."""
    import redis
    command = engine_command(command)
    try:
        return client.execute_command(*command)
    except redis.ResponseError as e:
        if "Function not found" not in str(e):
            raise
    client.function_load(decide_library()[0], replace=True)
    return client.execute_command(*command)


class Decided(NamedTuple):
    time_us: int  # the call's time: every charge it made is of that time
    results: list  # per request: (allowed, [(allowed, remaining, reset_ms, retry_ms)]) or error
    # per request: the 4th value of each limit (a shadow token bucket that counts denied
    # requests: the debt its charge added, us), None for the others; [] for a failed request
    added: list = []


def _element(e):
    if isinstance(e, bytes):
        return e.decode()
    if isinstance(e, list):
        return [_element(x) for x in e]
    return e


def decide_reply(reply, requests: Iterable) -> Decided:
    """The codec's reading of the reply of decide_command(requests)."""
    requests = [list(r) for r in requests]
    answer = codec().ask({"op": "decode", "reply": _element(reply),
                          "requests": [[limit for _, limit in r] for r in requests]})
    assert answer["time_us"] is not None, \
        f"the reply does not start with the call's time: {reply!r}"
    results, added = [], []
    for part in answer["requests"]:
        assert "malformed" not in part, f"malformed reply for {requests!r}: {reply!r}"
        if "failed" in part:
            results.append(part["failed"])
            added.append([])
            continue
        values = part["decided"]
        assert all(x >= 0 for v in values for x in v), f"negative value: {reply!r}"
        per_limit = [(1 if outcome == "allowed" else 0, *v[:3])
                     for outcome, v in zip(part["outcomes"], values)]
        results.append((1 if part["allowed"] else 0, per_limit))
        added.append([v[3] if len(v) > 3 else None for v in values])
    assert answer["done"], f"reply too long: {reply!r}"
    return Decided(answer["time_us"], results, added)


def decided(reply, request: Iterable) -> tuple:
    """(allowed, [(allowed, remaining, reset_ms, retry_ms)] per limit) of a call of one request."""
    (result,) = decide_reply(reply, [request]).results
    assert not isinstance(result, str), f"the request failed: {result}"
    return result


def undo_command(limits_and_keys: Iterable[tuple], at_us: int) -> list:
    """The FCALL of the undo of what the call of time at_us charged to these (key, limit)."""
    return codec().ask({"op": "undo", "limits": _limits(limits_and_keys),
                        "time_us": at_us})["command"]


def undo_call(client, limits_and_keys: Iterable[tuple], at_us: int) -> int:
    """Runs undo_command(); how many keys it changed."""
    return client.execute_command(*engine_command(undo_command(limits_and_keys, at_us)))


def lease_command(limits_and_keys: Iterable[tuple], renew: bool) -> list:
    """The FCALL that renews (or frees) the slot ("lease") of each concurrency (key, limit)."""
    return codec().ask({"op": "lease", "limits": _limits(limits_and_keys),
                        "renew": renew})["command"]


def lease_call(client, limits_and_keys: Iterable[tuple], renew: bool) -> int:
    """Runs lease_command(); how many slots it found."""
    return client.execute_command(*engine_command(lease_command(limits_and_keys, renew)))
