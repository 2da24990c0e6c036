"""Fault injection for the emulator: make chosen NVML calls fail or end the process.

A fault matches by function name and/or by call number, and either raises an NVML error or
ends the process (os._exit, as a kill would: no cleanup, no state saved after the point of
death). Faults come from code (`FaultPlan([...])`) or, for subprocess tests, from the JSON in
the environment variable NODEAGENT_SIM_FAULTS, e.g.
`[{"function": "nvmlDeviceCreateGpuInstanceWithPlacement", "call": 2, "error": "IN_USE"}]`
or `[{"mutation": 3, "exit": 137, "when": "after"}]`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import pynvml

from nodeagent.errors import SimError

FAULTS_ENV = "NODEAGENT_SIM_FAULTS"


@dataclass(frozen=True)
class Fault:
    """One rule. `call`: the Nth call of `function` (or of any function when None);
    `mutation`: the Nth call of any GPU-mutating function; neither: every matching call."""

    function: str | None = None
    call: int | None = None
    mutation: int | None = None
    error: int | None = None
    exit_code: int | None = None
    when: str = "before"


def _error_code(value: Any) -> int:
    if isinstance(value, int):
        return value
    name = str(value).upper().removeprefix("NVML_ERROR_")
    code = getattr(pynvml, f"NVML_ERROR_{name}", None)
    if not isinstance(code, int):
        raise SimError(f"fault names unknown NVML error {value!r} (e.g. IN_USE, NOT_FOUND)")
    return code


def parse_faults(text: str) -> list[Fault]:
    """Parse the NODEAGENT_SIM_FAULTS JSON list; raises SimError on a malformed rule."""
    try:
        rules = json.loads(text)
    except json.JSONDecodeError as err:
        raise SimError(f"{FAULTS_ENV} is not JSON: {err.msg}") from err
    if not isinstance(rules, list):
        raise SimError(f"{FAULTS_ENV} must be a JSON list of fault rules")
    faults = []
    allowed = {"function", "call", "mutation", "error", "exit", "when"}
    for rule in rules:
        if not isinstance(rule, dict) or set(rule) - allowed:
            raise SimError(f"{FAULTS_ENV}: bad rule {rule!r}; keys: {', '.join(sorted(allowed))}")
        if ("error" in rule) == ("exit" in rule):
            raise SimError(f"{FAULTS_ENV}: rule {rule!r} needs exactly one of 'error' or 'exit'")
        if rule.get("when", "before") not in ("before", "after"):
            raise SimError(f"{FAULTS_ENV}: rule {rule!r}: 'when' is 'before' or 'after'")
        faults.append(
            Fault(
                function=rule.get("function"),
                call=rule.get("call"),
                mutation=rule.get("mutation"),
                error=_error_code(rule["error"]) if "error" in rule else None,
                exit_code=int(rule["exit"]) if "exit" in rule else None,
                when=rule.get("when", "before"),
            )
        )
    return faults


class SimulatedCrash(BaseException):
    """Raised instead of ending the process when a FaultPlan is `in_process`: like a kill,
    it is no Exception, so no `except Exception` handler of nodeagent's catches it."""


@dataclass
class FaultPlan:
    """Counts calls and decides which fault, if any, hits the current one."""

    faults: list[Fault] = field(default_factory=list)
    in_process: bool = False
    calls: int = 0
    mutations: int = 0
    per_function: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_env(cls) -> FaultPlan:
        text = os.environ.get(FAULTS_ENV, "").strip()
        return cls(parse_faults(text) if text else [])

    def on_call(self, function: str, mutating: bool) -> list[Fault]:
        """Record a call; return the faults that fire on it."""
        self.calls += 1
        self.per_function[function] = self.per_function.get(function, 0) + 1
        if mutating:
            self.mutations += 1
        fired = []
        for f in self.faults:
            if f.function is not None and f.function != function:
                continue
            if f.mutation is not None and not (mutating and self.mutations == f.mutation):
                continue
            if f.call is not None:
                count = self.per_function[function] if f.function else self.calls
                if count != f.call:
                    continue
            fired.append(f)
        return fired
