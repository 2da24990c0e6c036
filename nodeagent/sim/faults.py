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

from nodeagent.base.errors import SimError, shown

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


_RULE_KEYS = ("function", "call", "mutation", "error", "exit", "when")


def _error_codes() -> dict[str, int]:
    """NVML's error names (IN_USE) and their codes, as pynvml defines them."""
    return {
        name.removeprefix("NVML_ERROR_"): value
        for name, value in vars(pynvml).items()
        if name.startswith("NVML_ERROR_") and isinstance(value, int)
    }


def emulated_functions() -> dict[str, str]:
    """The NVML functions a fault can hit: each name the emulator answers to (aliases such as
    `..._v3` included) -> the name its calls are counted under."""
    from nodeagent.sim.library import SimulatedNvml  # the emulator imports this module

    names = {}
    for name in dir(SimulatedNvml):
        fn = getattr(SimulatedNvml, name)
        if name.startswith("nvml") and callable(fn) and hasattr(fn, "__wrapped__"):
            names[name] = fn.__name__
    return names


def _error_code(value: Any, where: str) -> int:
    codes = _error_codes()
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise SimError(f"{where}: 'error' must be an NVML error name or code, not {shown(value)}")
    if isinstance(value, int):
        if value not in codes.values():
            raise SimError(f"{where}: 'error' {value} is no NVML error code (e.g. 19, IN_USE)")
        return value
    code = codes.get(value.upper().removeprefix("NVML_ERROR_"))
    if code is None:
        raise SimError(f"{where}: 'error' names unknown NVML error {shown(value)} (e.g. IN_USE)")
    return code


def _count(rule: dict[str, Any], key: str, where: str) -> int | None:
    value = rule.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SimError(f"{where}: {key!r} must be a whole number from 1 up, not {shown(value)}")
    return value


def _function(rule: dict[str, Any], where: str) -> str | None:
    value = rule.get("function")
    if value is None:
        return None
    functions = emulated_functions()
    if not isinstance(value, str) or value not in functions:
        raise SimError(
            f"{where}: 'function' {shown(value)} is no NVML function of the emulator's"
            " (pynvml's names, e.g. nvmlDeviceCreateGpuInstanceWithPlacement)"
        )
    return functions[value]


def _rule(rule: Any, where: str) -> Fault:
    if not isinstance(rule, dict):
        raise SimError(f"{where} must be an object (a rule), not {shown(rule)}")
    unknown = sorted(set(rule) - set(_RULE_KEYS))
    if unknown:
        raise SimError(
            f"{where} is a bad rule: unknown key {shown(unknown[0])}; keys: {', '.join(_RULE_KEYS)}"
        )
    if ("error" in rule) == ("exit" in rule):
        raise SimError(f"{where} needs exactly one of 'error' or 'exit'")
    exit_code = rule.get("exit")
    if "exit" in rule and (
        isinstance(exit_code, bool) or not isinstance(exit_code, int) or not 0 <= exit_code <= 255
    ):
        raise SimError(
            f"{where}: 'exit' must be a process exit status 0 to 255, not {shown(exit_code)}"
        )
    when = rule.get("when", "before")
    if when not in ("before", "after"):
        raise SimError(f"{where}: 'when' is 'before' or 'after', not {shown(when)}")
    return Fault(
        function=_function(rule, where),
        call=_count(rule, "call", where),
        mutation=_count(rule, "mutation", where),
        error=_error_code(rule["error"], where) if "error" in rule else None,
        exit_code=exit_code,
        when=when,
    )


def parse_faults(text: str) -> list[Fault]:
    """Parse the NODEAGENT_SIM_FAULTS JSON list; raises SimError naming the variable and the
    index of the first bad rule."""
    try:
        rules = json.loads(text)
    except json.JSONDecodeError as err:
        raise SimError(f"{FAULTS_ENV} is not JSON: {err.msg} (column {err.colno})") from err
    except (ValueError, RecursionError) as err:
        raise SimError(f"{FAULTS_ENV} is not JSON the emulator can read") from err
    if not isinstance(rules, list):
        raise SimError(f"{FAULTS_ENV} must be a JSON list of fault rules")
    return [_rule(rule, f"{FAULTS_ENV}[{i}]") for i, rule in enumerate(rules)]


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
