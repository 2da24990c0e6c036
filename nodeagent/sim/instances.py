"""Emulated NVML calls: GPU instances, compute instances, MIG devices."""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml

from nodeagent.sim.base import (
    _KIND_CI,
    _KIND_DEVICE,
    _KIND_GI,
    _KIND_MIG,
    MAX_MIG_DEVICES,
    SimBase,
    _decode,
    _fail,
    _handle,
    _ref_value,
    nvml_call,
)
from nodeagent.sim.models import (
    INVALID_ARGUMENT_CONSTANTS,
    PROFILE_CONSTANT_COUNT,
    DeviceModel,
    ProfileModel,
)
from nodeagent.sim.rules import (
    CI_IDS,
    CI_SLICES,
    GI_IDS,
    ci_conflict,
    ci_multiprocessors,
    ci_starts,
    gi_conflict,
    gi_id_for,
)
from nodeagent.sim.state import CiState, GiState, GpuState


def _fill(array: Any, count_ref: Any, handles: list[Any]) -> int:
    """NVML's list-call contract: the count by reference always; INSUFFICIENT_SIZE when the
    caller's array is missing or too small, else the handles in it."""
    count = _ref_value(count_ref)
    count.value = len(handles)
    if array is None or len(array) < len(handles):
        _fail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
    for i, h in enumerate(handles):
        array[i] = h
    return int(pynvml.NVML_SUCCESS)


class InstanceCalls(SimBase):
    # -- GPU instances ----------------------------------------------------------------------

    @nvml_call()
    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, handle: Any, profile: int, version: int = 2
    ) -> Any:
        _, model = self._gpu(handle)
        if not 0 <= profile < PROFILE_CONSTANT_COUNT or profile in INVALID_ARGUMENT_CONSTANTS:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        p = model.profile_by_constant(profile)
        if p is None:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        assert p is not None
        return self._profile_info(p)

    nvmlDeviceGetGpuInstanceProfileInfoV = nvmlDeviceGetGpuInstanceProfileInfo

    @nvml_call()
    def nvmlDeviceGetGpuInstanceProfileInfoById(self, handle: Any, profileId: int) -> Any:
        return self._profile_info(self._profile(self._gpu(handle)[1], profileId))

    @staticmethod
    def _profile_info(p: ProfileModel) -> Any:
        info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
        info.version = pynvml.nvmlGpuInstanceProfileInfo_v2
        info.id, info.isP2pSupported, info.sliceCount = p.id, p.is_p2p_supported, p.slice_count
        info.instanceCount, info.multiprocessorCount = p.instance_count, p.multiprocessor_count
        info.copyEngineCount, info.decoderCount = p.copy_engine_count, p.decoder_count
        info.encoderCount, info.jpegCount, info.ofaCount = (
            p.encoder_count,
            p.jpeg_count,
            p.ofa_count,
        )
        info.memorySizeMB, info.name = p.memory_size_mb, p.name.encode()
        return info

    def _conflict(self, gpu: GpuState, model: DeviceModel, p: ProfileModel, start: int) -> bool:
        """Would a GI of profile p at `start` break a hardware rule on this GPU?"""
        return gi_conflict(gpu.gis.values(), model, p, start) is not None

    @nvml_call()
    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, handle: Any, profileId: int) -> int:
        gpu, model = self._gpu(handle)
        p = self._profile(model, profileId)
        # Greedy count of how many more fit, trying placements in order.
        trial = GpuState(gpu.index, gpu.model, gpu.uuid, gpu.pci_bus_id, gis=dict(gpu.gis))
        count = 0
        for start, size in p.placements:
            if not self._conflict(trial, model, p, start):
                trial.gis[-1 - count] = GiState(-1 - count, p.id, start, size)
                count += 1
        return count

    @nvml_call()
    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, handle: Any, profileId: int, placementsRef: Any, countRef: Any
    ) -> int:
        _, model = self._gpu(handle)
        p = self._profile(model, profileId)
        count = _ref_value(countRef)
        if placementsRef is None:
            count.value = len(p.placements)
            return int(pynvml.NVML_SUCCESS)
        if len(placementsRef) < len(p.placements):
            count.value = len(p.placements)
            _fail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for i, (start, size) in enumerate(p.placements):
            placementsRef[i].start, placementsRef[i].size = start, size
        count.value = len(p.placements)
        return int(pynvml.NVML_SUCCESS)

    def _create_gi(self, gpu: GpuState, model: DeviceModel, p: ProfileModel, start: int) -> Any:
        size = next(n for s, n in p.placements if s == start)
        gi_id = gi_id_for(model.memory_slices, start, size)
        if gi_id is None or gi_id in gpu.gis:
            gi_id = next(i for i in GI_IDS if i not in gpu.gis)
        gpu.gis[gi_id] = GiState(gi_id, p.id, start, size)
        return _handle(_KIND_GI, gpu.index, gi_id, ptype=pynvml.c_nvmlGpuInstance_t)

    @nvml_call(mutating=True)
    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, handle: Any, profileId: int, placement: Any
    ) -> Any:
        gpu, model = self._gpu(handle)
        self._mig_on(gpu)
        p = self._profile(model, profileId)
        placement = _ref_value(placement)
        if (placement.start, placement.size) not in p.placements:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self._conflict(gpu, model, p, placement.start):
            _fail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        return self._create_gi(gpu, model, p, placement.start)

    @nvml_call(mutating=True)
    def nvmlDeviceCreateGpuInstance(self, handle: Any, profileId: int) -> Any:
        """Without a placement the first free one is taken: order-dependent, as on hardware."""
        gpu, model = self._gpu(handle)
        self._mig_on(gpu)
        p = self._profile(model, profileId)
        for start, _ in p.placements:
            if not self._conflict(gpu, model, p, start):
                return self._create_gi(gpu, model, p, start)
        return _fail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)

    @nvml_call()
    def nvmlDeviceGetGpuInstances(
        self, handle: Any, profileId: int, gpuInstancesRef: Any, countRef: Any
    ) -> int:
        gpu, model = self._gpu(handle)
        self._mig_on(gpu)
        p = self._profile(model, profileId)
        found = [gi for _, gi in sorted(gpu.gis.items()) if gi.profile_id == p.id]
        handles = [
            _handle(_KIND_GI, gpu.index, gi.id, ptype=pynvml.c_nvmlGpuInstance_t) for gi in found
        ]
        return _fill(gpuInstancesRef, countRef, handles)

    @nvml_call()
    def nvmlDeviceGetGpuInstanceById(self, handle: Any, gpuInstanceId: int) -> Any:
        gpu, _ = self._gpu(handle)
        self._mig_on(gpu)
        if gpuInstanceId not in gpu.gis:
            _fail(pynvml.NVML_ERROR_NOT_FOUND)
        return _handle(_KIND_GI, gpu.index, gpuInstanceId, ptype=pynvml.c_nvmlGpuInstance_t)

    @nvml_call()
    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> Any:
        gpu, _, gi = self._gi(gpuInstance)
        info = pynvml.c_nvmlGpuInstanceInfo_t()
        info.device = _handle(_KIND_DEVICE, gpu.index)
        info.id, info.profileId = gi.id, gi.profile_id
        info.placement.start, info.placement.size = gi.start, gi.size
        return info

    @nvml_call(mutating=True)
    def nvmlGpuInstanceDestroy(self, gpuInstance: Any) -> int:
        gpu, _, gi = self._gi(gpuInstance)
        if gi.cis or self._processes_on(gpu.index, gi.id):
            _fail(pynvml.NVML_ERROR_IN_USE)
        del gpu.gis[gi.id]
        return int(pynvml.NVML_SUCCESS)

    # -- compute instances ------------------------------------------------------------------

    @nvml_call()
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gpuInstance: Any, profile: int, engProfile: int, version: int = 2
    ) -> Any:
        _, model, gi = self._gi(gpuInstance)
        gi_profile = self._profile(model, gi.profile_id)
        slices = self._ci_slices(gi_profile, profile)
        if engProfile != pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
        info.version = pynvml.nvmlComputeInstanceProfileInfo_v2
        info.id, info.sliceCount = profile, slices
        info.instanceCount = len(ci_starts(gi_profile.slice_count, slices))
        info.multiprocessorCount = ci_multiprocessors(model, gi_profile, slices)
        info.sharedCopyEngineCount = gi_profile.copy_engine_count
        info.sharedDecoderCount = gi_profile.decoder_count
        info.sharedEncoderCount = gi_profile.encoder_count
        info.sharedJpegCount = gi_profile.jpeg_count
        info.sharedOfaCount = gi_profile.ofa_count
        short = gi_profile.name.removeprefix("MIG ")
        info.name = (short if slices == gi_profile.slice_count else f"{slices}c.{short}").encode()
        return info

    nvmlGpuInstanceGetComputeInstanceProfileInfoV = nvmlGpuInstanceGetComputeInstanceProfileInfo

    @staticmethod
    def _ci_slices(gi_profile: ProfileModel, profile_id: int) -> int:
        """The compute slices of CI profile `profile_id` in a GI of `gi_profile`; NOT_SUPPORTED
        when that GI does not offer it."""
        slices = CI_SLICES.get(profile_id)
        if slices is None or not ci_starts(gi_profile.slice_count, slices):
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        assert slices is not None
        return slices

    def _free_ci_starts(self, gi: GiState, gi_profile: ProfileModel, profile_id: int) -> list[int]:
        slices = self._ci_slices(gi_profile, profile_id)
        return [
            s
            for s in ci_starts(gi_profile.slice_count, slices)
            if ci_conflict(gi, gi_profile.slice_count, profile_id, s) is None
        ]

    @nvml_call()
    def nvmlGpuInstanceGetComputeInstanceRemainingCapacity(
        self, gpuInstance: Any, profileId: int
    ) -> int:
        _, model, gi = self._gi(gpuInstance)
        gi_profile = self._profile(model, gi.profile_id)
        trial = GiState(gi.id, gi.profile_id, gi.start, gi.size, dict(gi.cis))
        n = 0
        while free := self._free_ci_starts(trial, gi_profile, profileId):
            trial.cis[-1 - n] = CiState(-1 - n, profileId, "", free[0])
            n += 1
        return n

    @nvml_call()
    def nvmlGpuInstanceGetComputeInstancePossiblePlacements(
        self, gpuInstance: Any, profileId: int, placementsRef: Any, countRef: Any
    ) -> int:
        _, model, gi = self._gi(gpuInstance)
        gi_profile = self._profile(model, gi.profile_id)
        slices = self._ci_slices(gi_profile, profileId)
        found = ci_starts(gi_profile.slice_count, slices)
        count = _ref_value(countRef)
        count.value = len(found)
        if placementsRef is None:
            return int(pynvml.NVML_SUCCESS)
        if len(placementsRef) < len(found):
            _fail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for i, start in enumerate(found):
            placementsRef[i].start, placementsRef[i].size = start, slices
        return int(pynvml.NVML_SUCCESS)

    def _create_ci(self, gpu: GpuState, gi: GiState, profile_id: int, start: int) -> Any:
        ci_id = next(i for i in CI_IDS if i not in gi.cis)
        gi.cis[ci_id] = CiState(ci_id, profile_id, gpu.new_mig_uuid(), start)
        return _handle(_KIND_CI, gpu.index, gi.id, ci_id, ptype=pynvml.c_nvmlComputeInstance_t)

    @nvml_call(mutating=True)
    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: Any, profileId: int) -> Any:
        """Without a placement the first free one is taken, as on hardware."""
        gpu, model, gi = self._gi(gpuInstance)
        free = self._free_ci_starts(gi, self._profile(model, gi.profile_id), profileId)
        if not free:
            _fail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        return self._create_ci(gpu, gi, profileId, free[0])

    @nvml_call(mutating=True)
    def nvmlGpuInstanceCreateComputeInstanceWithPlacement(
        self, gpuInstance: Any, profileId: int, placement: Any
    ) -> Any:
        gpu, model, gi = self._gi(gpuInstance)
        gi_profile = self._profile(model, gi.profile_id)
        slices = self._ci_slices(gi_profile, profileId)
        placement = _ref_value(placement)
        if placement.size != slices or placement.start not in ci_starts(
            gi_profile.slice_count, slices
        ):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if ci_conflict(gi, gi_profile.slice_count, profileId, placement.start):
            _fail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        return self._create_ci(gpu, gi, profileId, placement.start)

    @nvml_call()
    def nvmlGpuInstanceGetComputeInstances(
        self, gpuInstance: Any, profileId: int, computeInstancesRef: Any, countRef: Any
    ) -> int:
        gpu, _, gi = self._gi(gpuInstance)
        found = [ci for _, ci in sorted(gi.cis.items()) if ci.profile_id == profileId]
        handles = [
            _handle(_KIND_CI, gpu.index, gi.id, ci.id, ptype=pynvml.c_nvmlComputeInstance_t)
            for ci in found
        ]
        return _fill(computeInstancesRef, countRef, handles)

    @nvml_call()
    def nvmlGpuInstanceGetComputeInstanceById(
        self, gpuInstance: Any, computeInstanceId: int
    ) -> Any:
        gpu, _, gi = self._gi(gpuInstance)
        if computeInstanceId not in gi.cis:
            _fail(pynvml.NVML_ERROR_NOT_FOUND)
        return _handle(
            _KIND_CI, gpu.index, gi.id, computeInstanceId, ptype=pynvml.c_nvmlComputeInstance_t
        )

    @nvml_call()
    def nvmlComputeInstanceGetInfo(self, computeInstance: Any) -> Any:
        gpu, gi, ci = self._ci(computeInstance)
        info = pynvml.c_nvmlComputeInstanceInfo_t()
        info.device = _handle(_KIND_DEVICE, gpu.index)
        info.gpuInstance = _handle(_KIND_GI, gpu.index, gi.id, ptype=pynvml.c_nvmlGpuInstance_t)
        info.id, info.profileId = ci.id, ci.profile_id
        info.placement.start, info.placement.size = ci.start, CI_SLICES[ci.profile_id]
        return info

    nvmlComputeInstanceGetInfo_v2 = nvmlComputeInstanceGetInfo

    @nvml_call(mutating=True)
    def nvmlComputeInstanceDestroy(self, computeInstance: Any) -> int:
        gpu, gi, ci = self._ci(computeInstance)
        if self._processes_on(gpu.index, gi.id, ci.id):
            _fail(pynvml.NVML_ERROR_IN_USE)
        del gi.cis[ci.id]
        return int(pynvml.NVML_SUCCESS)

    # -- MIG devices ------------------------------------------------------------------------

    @nvml_call()
    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        gpu, _ = self._gpu(handle)
        return MAX_MIG_DEVICES if gpu.mig_current else 0

    @nvml_call()
    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> Any:
        gpu, _ = self._gpu(handle)
        self._mig_on(gpu)
        if not 0 <= index < MAX_MIG_DEVICES:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        devices = self._mig_devices(gpu)
        if index >= len(devices):
            _fail(pynvml.NVML_ERROR_NOT_FOUND)
        gi, ci = devices[index]
        return _handle(_KIND_MIG, gpu.index, gi.id, ci.id)

    @nvml_call()
    def nvmlDeviceIsMigDeviceHandle(self, handle: Any) -> Any:
        return ctypes.c_uint(1 if _decode(handle)[0] == _KIND_MIG else 0)

    @nvml_call()
    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: Any) -> Any:
        gpu, _, _, _ = self._mig_target(migDevice)
        return _handle(_KIND_DEVICE, gpu.index)

    @nvml_call()
    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        return self._mig_target(handle)[2].id

    @nvml_call()
    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        return self._mig_target(handle)[3].id

    @nvml_call()
    def nvmlDeviceGetAttributes(self, handle: Any) -> Any:
        """MIG devices only; a full GPU answers NOT_SUPPORTED (seen on the real H200)."""
        if _decode(handle)[0] != _KIND_MIG:
            self._gpu(handle)
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        _, model, gi, ci = self._mig_target(handle)
        p = self._profile(model, gi.profile_id)
        slices = CI_SLICES[ci.profile_id]
        attrs = pynvml.c_nvmlDeviceAttributes()
        attrs.multiprocessorCount = ci_multiprocessors(model, p, slices)
        attrs.sharedCopyEngineCount, attrs.sharedDecoderCount = p.copy_engine_count, p.decoder_count
        attrs.sharedEncoderCount, attrs.sharedJpegCount = p.encoder_count, p.jpeg_count
        attrs.sharedOfaCount = p.ofa_count
        attrs.gpuInstanceSliceCount, attrs.computeInstanceSliceCount = p.slice_count, slices
        attrs.memorySizeMB = p.memory_size_mb
        return attrs

    nvmlDeviceGetAttributes_v2 = nvmlDeviceGetAttributes
