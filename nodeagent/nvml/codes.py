"""NVML's return codes, named once (nvml.h's nvmlReturn_t; tests/unit/nvml/test_codes.py holds
them against pynvml's NVML_ERROR_* constants), and NVML's own texts for them."""

from __future__ import annotations

SUCCESS = 0
UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
INSUFFICIENT_SIZE = 7
DRIVER_NOT_LOADED = 9
TIMEOUT = 10  # nvmlEventSetWait's "no event"
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13  # a driver older than the call
GPU_IS_LOST = 15
RESET_REQUIRED = 16
LIB_RM_VERSION_MISMATCH = 18
IN_USE = 19
MEMORY = 20
INSUFFICIENT_RESOURCES = 23
INVALID_STATE = 29
UNKNOWN = 999
# NVML or the GPU is gone: uninitialised, driver not loaded, GPU lost, driver/library mismatch
GONE = frozenset({UNINITIALIZED, DRIVER_NOT_LOADED, GPU_IS_LOST, LIB_RM_VERSION_MISMATCH})

# NVML's own nvmlErrorString texts for the codes pynvml cannot name without the library.
MESSAGES = {
    UNINITIALIZED: "Uninitialized",
    INVALID_ARGUMENT: "Invalid Argument",
    NOT_SUPPORTED: "Not Supported",
    NO_PERMISSION: "Insufficient Permissions",
    NOT_FOUND: "Not Found",
    INSUFFICIENT_SIZE: "Insufficient Size",
    DRIVER_NOT_LOADED: "Driver Not Loaded",
    TIMEOUT: "Timeout",
    LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    FUNCTION_NOT_FOUND: "Function Not Found",
    GPU_IS_LOST: "GPU is lost",
    RESET_REQUIRED: "GPU requires restart",
    IN_USE: "In use by another client",
    MEMORY: "Insufficient Memory",
    INSUFFICIENT_RESOURCES: "Insufficient resources",
    INVALID_STATE: "Invalid state",
    UNKNOWN: "Unknown Error",
}


def message_for(code: int) -> str:
    return MESSAGES.get(code, f"NVML error {code}")
