"""The BMRuntime C++ API (``bmruntime_cpp.h``, namespace ``bmruntime``) as Python classes:
:class:`Context` (loads bmodels, answers about networks), :class:`Network` (one network of a
context, its input and output :class:`Tensor` s, ``Forward``) and the global ``ByteSize`` /
``Count`` / ``IsSameShape``. Methods that return ``bm_status_t`` in C++ return it here; none
raises. C++ destructors are :meth:`Context.close` / :meth:`Network.close` (or ``with``).
"""

from __future__ import annotations

import os
from types import TracebackType
from typing import Any

from ...errors import InvalidArgumentError, OperationForbiddenError
from ..bmlib import DeviceMemory
from .device import bm_dev_free, bm_dev_request, bm_handle_t
from .launch import launch
from .runtime import Bmruntime, bmrt_destroy, bmrt_trace
from .status import BM_SUCCESS, ERRORS, bm_status_t, failed
from .sync import bm_thread_sync
from .types import (
    BM_STORE_1N,
    bm_data_type_t,
    bm_net_info_t,
    bm_shape_t,
    bm_store_mode_t,
    bm_tensor_t,
    bmrt_data_type_size,
    bmrt_shape_count,
    bmrt_shape_is_same,
    bmrt_tensor_bytesize,
)

__all__ = ["ByteSize", "Context", "Count", "IsSameShape", "Network", "Tensor"]


class Context:
    """Loaded bmodels on one device: ``Context(devid=0)`` or ``Context(bm_handle)``.

    Made with a devid it requests (and at :meth:`close` frees) its own handle; made with a
    handle, close the context before ``bm_dev_free`` of the handle.
    """

    def __init__(self, devid: int | str | bm_handle_t = 0) -> None:
        self._own_handle = not isinstance(devid, bm_handle_t)
        if isinstance(devid, bm_handle_t):
            handle: bm_handle_t | None = devid
        else:
            status, handle = bm_dev_request(devid)
            if status != BM_SUCCESS:
                raise InvalidArgumentError(f"Context({devid!r}): no such device ({status.name})")
        assert handle is not None
        self._handle = handle
        self._bmrt = Bmruntime([handle])

    def load_bmodel(self, bmodel: Any, size: int | None = None) -> bm_status_t:
        """Load a ``.crm`` file (a path) or its bytes (``bmodel_data, size``); may be called
        from several threads. A network name loaded already fails the load (BM_ERR_FAILURE)."""
        try:
            if isinstance(bmodel, str | os.PathLike):
                self._bmrt.load(os.fspath(bmodel))
            else:
                data = memoryview(bmodel).cast("B")
                self._bmrt.load(bytes(data if size is None else data[:size]))
        except ERRORS as exc:
            return failed("Context.load_bmodel", exc)
        return BM_SUCCESS

    def get_network_number(self) -> int:
        """How many networks are loaded."""
        return len(self._bmrt.networks)

    def get_network_names(self, names: list[str]) -> None:
        """Clear ``names`` and append every loaded network's name (as the C++ vector).

        Raises:
            InvalidArgumentError: ``names`` is not a list (C++ would crash on a NULL vector).
        """
        if not isinstance(names, list):
            raise InvalidArgumentError(
                f"Context.get_network_names: names is {names!r}; give a list to fill"
            )
        names.clear()
        names.extend(self._bmrt.networks)

    def get_network_info(self, net_name: str) -> bm_net_info_t | None:
        """The network's info; None when it is not loaded."""
        net = self._bmrt.networks.get(net_name)
        return None if net is None else net.info

    def handle(self) -> bm_handle_t:
        """The device handle."""
        return self._handle

    def trace(self) -> None:
        """Print the context's devices, networks and memory."""
        bmrt_trace(self._bmrt)

    def close(self) -> None:
        """The destructor: unload everything (and free the handle the context requested)."""
        bmrt_destroy(self._bmrt)
        if self._own_handle:
            bm_dev_free(self._handle)

    def __enter__(self) -> Context:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class Tensor:
    """An input or output of a :class:`Network` (made by it, never by the caller)."""

    def __init__(self, network: Network, name: str, dtype: bm_data_type_t, shape: bm_shape_t):
        self._network = network
        self.name = name
        self._tensor = bm_tensor_t(dtype, shape, None, BM_STORE_1N)
        self._fixed = False  # a Network made for one stage: inputs cannot be reshaped

    def _device(self) -> Any:
        return self._network._context.handle().check()

    def _mem(self) -> DeviceMemory:
        if self._tensor.device_mem is None:
            raise OperationForbiddenError(
                f"tensor {self.name!r} has no device memory yet: an output gets it at Forward, "
                "or give it some with set_device_mem"
            )
        return self._tensor.device_mem

    def CopyTo(self, data: Any, size: int | None = None, offset: int = 0) -> bm_status_t:
        """Copy ``size`` bytes (default ``ByteSize()``) from byte ``offset`` of the device
        memory to host buffer ``data``."""
        try:
            n = self.ByteSize() if size is None else size
            self._within(n, offset)
            self._device().memcpy_d2s(data, self._mem(), n, offset)
        except ERRORS as exc:
            return failed("Tensor.CopyTo", exc)
        return BM_SUCCESS

    def CopyFrom(self, data: Any, size: int | None = None, offset: int = 0) -> bm_status_t:
        """Copy ``size`` bytes (default ``ByteSize()``) from host buffer ``data`` to the
        device memory at byte ``offset``."""
        try:
            n = self.ByteSize() if size is None else size
            self._within(n, offset)
            self._device().memcpy_s2d(self._mem(), data, n, offset)
        except ERRORS as exc:
            return failed("Tensor.CopyFrom", exc)
        return BM_SUCCESS

    def _within(self, size: int, offset: int) -> None:
        if offset < 0 or size < 0 or offset + size > self.ByteSize():
            raise InvalidArgumentError(
                f"tensor {self.name!r}: {size} bytes at offset {offset} are outside its "
                f"{self.ByteSize()} bytes"
            )

    def Reshape(self, shape: bm_shape_t) -> bm_status_t:
        """Set the shape of an input (refused on a Network made for one stage)."""
        if self._fixed:
            return failed(
                "Tensor.Reshape",
                OperationForbiddenError(
                    f"input {self.name!r} belongs to a Network made for stage "
                    f"{self._network.stage_id}: its shape is fixed; make the Network with "
                    "stage_id=-1 to reshape"
                ),
            )
        self._tensor.shape = shape
        return BM_SUCCESS

    def ByteSize(self) -> int:
        """Elements times bytes per element."""
        return bmrt_tensor_bytesize(self._tensor)

    def num_elements(self) -> int:
        """The number of elements (1 for no dims)."""
        return bmrt_shape_count(self._tensor.shape)

    def tensor(self) -> bm_tensor_t:
        """The ``bm_tensor_t``: dtype, shape, device memory, store mode."""
        return self._tensor

    def set_store_mode(self, mode: bm_store_mode_t) -> None:
        """Set the store mode: how the tensor lies in its device memory (BM_STORE_2N for
        16-bit types, BM_STORE_4N for 8-bit ones; the run sees BM_STORE_1N).

        Raises:
            InvalidArgumentError: ``mode`` is no bm_store_mode_t.
        """
        try:
            self._tensor.st_mode = bm_store_mode_t(mode)
        except ValueError:
            raise InvalidArgumentError(
                f"Tensor.set_store_mode: {mode!r} is no store mode; give BM_STORE_1N, "
                "BM_STORE_2N or BM_STORE_4N"
            ) from None

    def set_device_mem(self, device_mem: DeviceMemory) -> bm_status_t:
        """Use ``device_mem`` for this tensor; it must hold ``ByteSize()`` bytes."""
        if not isinstance(device_mem, DeviceMemory) or device_mem.size < self.ByteSize():
            size = getattr(device_mem, "size", None)
            return failed(
                "Tensor.set_device_mem",
                InvalidArgumentError(
                    f"tensor {self.name!r} needs {self.ByteSize()} bytes; the device memory "
                    f"holds {size}"
                ),
            )
        self._tensor.device_mem = device_mem
        return BM_SUCCESS

    def __repr__(self) -> str:
        t = self._tensor
        return f"Tensor({self.name!r}, {t.dtype.name}, {list(t.shape.shape)})"


class Network:
    """One network of a :class:`Context`, with device memory for its inputs and outputs.

    Args:
        ctx: the context the network was loaded into.
        net_name: its name.
        stage_id: -1: the inputs start with stage 0's shapes and may be reshaped; a stage's
            index: the inputs have that stage's shapes, fixed.
    """

    def __init__(self, ctx: Context, net_name: str, stage_id: int = -1) -> None:
        info = ctx.get_network_info(net_name)
        if info is None:
            raise InvalidArgumentError(f"Network: no network {net_name!r} in the context")
        if not -1 <= stage_id < info.stage_num:
            raise InvalidArgumentError(
                f"Network {net_name!r}: stage_id {stage_id} is not -1 or 0..{info.stage_num - 1}"
            )
        self._context = ctx
        self._info = info
        self.stage_id = stage_id
        stage = info.stages[max(stage_id, 0)]
        device = ctx.handle().check()
        self._owned: list[DeviceMemory] = []
        self._per_run: list[DeviceMemory] = []
        ins = zip(info.input_names, info.input_dtypes, stage.input_shapes, strict=True)
        self._inputs = [Tensor(self, n, dt, bm_shape_t.of(s.shape)) for n, dt, s in ins]
        self._outputs = [
            Tensor(self, n, dt, bm_shape_t.of(s.shape))
            for n, dt, s in zip(
                info.output_names, info.output_dtypes, stage.output_shapes, strict=True
            )
        ]
        sizes = [*info.max_input_bytes, *info.max_output_bytes]
        for t, size in zip([*self._inputs, *self._outputs], sizes, strict=True):
            t._fixed = stage_id >= 0 and t in self._inputs
            if size:  # unknown (0) for a dynamic network's outputs: Forward allocates
                mem = device.malloc(size, name=f"{net_name}:{t.name}")
                self._owned.append(mem)
                t._tensor.device_mem = mem

    def Inputs(self) -> list[Tensor]:
        """The input tensors, in order."""
        return self._inputs

    def Input(self, tensor_name: str) -> Tensor | None:
        """The input called ``tensor_name`` (None if there is none)."""
        return next((t for t in self._inputs if t.name == tensor_name), None)

    def Outputs(self) -> list[Tensor]:
        """The output tensors; their shapes and data are valid after :meth:`Forward`."""
        return self._outputs

    def Output(self, tensor_name: str) -> Tensor | None:
        """The output called ``tensor_name`` (None if there is none)."""
        return next((t for t in self._outputs if t.name == tensor_name), None)

    def info(self) -> bm_net_info_t:
        """The network's info."""
        return self._info

    def Forward(self, sync: bool = True) -> bm_status_t:
        """Run the network on the inputs' device memory into the outputs'. With
        ``sync=False`` it returns at once: call ``bm_thread_sync(ctx.handle())``."""
        outs = [t._tensor for t in self._outputs]
        for mem in self._per_run:  # a dynamic network's outputs of the last Forward
            self._context.handle().device.free(mem)
            for t in outs:
                t.device_mem = None if t.device_mem is mem else t.device_mem
        self._per_run = []
        user_mem = all(t.device_mem is not None for t in outs)
        try:
            launch(
                self._context._bmrt,
                self._info.name,
                [t._tensor for t in self._inputs],
                len(self._inputs),
                outs,
                len(outs),
                user_mem,
                True,
            )
        except ERRORS as exc:
            return failed("Network.Forward", exc)
        if not user_mem:
            self._per_run = [t.device_mem for t in outs if t.device_mem is not None]
        return bm_thread_sync(self._context.handle()) if sync else BM_SUCCESS

    def close(self) -> None:
        """The destructor: free the device memory the network allocated."""
        handle = self._context.handle()
        if handle.freed:
            return
        for mem in [*self._owned, *self._per_run]:
            handle.device.free(mem)
        self._owned.clear()
        self._per_run.clear()

    def __enter__(self) -> Network:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def ByteSize(value: Any) -> int:
    """Bytes of a ``bm_data_type_t``, a device memory, a ``bm_tensor_t`` or a Tensor."""
    if isinstance(value, DeviceMemory):
        return value.size
    if isinstance(value, bm_tensor_t):
        return bmrt_tensor_bytesize(value)
    if isinstance(value, Tensor):
        return value.ByteSize()
    return bmrt_data_type_size(value)


def Count(value: bm_shape_t | bm_tensor_t | Tensor) -> int:
    """Elements of a shape, a ``bm_tensor_t`` or a Tensor (1 for no dims)."""
    if isinstance(value, Tensor):
        return value.num_elements()
    return bmrt_shape_count(value.shape if isinstance(value, bm_tensor_t) else value)


def IsSameShape(left: bm_shape_t, right: bm_shape_t) -> bool:
    """Whether two shapes have the same dims."""
    return bmrt_shape_is_same(left, right)
