"""Where a run's results go: caller arrays, crossrt Tensors, TensorSets, or memory the runtime
allocates (``bmrt_launch_tensor``'s ``user_mem`` semantics).

- A NumPy array or a host :class:`Tensor` for an output whose shape is known before the run
  is bound in place: the engine writes into it, nothing is copied. A tensor with more bytes
  than needed takes the output's shape (``set_shape``); one with fewer is refused before the
  run, naming the bytes needed.
- A tensor for a dynamic output (its shape is known only after the run), or one the host
  cannot address, receives a copy of the result and its shape; one too small is refused
  naming the bytes needed. These copies count in :func:`~.memory.copied_bytes`.
- ``None`` (or a name missing from a :class:`TensorSet`) lets the runtime allocate: the
  engine's result becomes a tensor charged to the model's memory budget, without a copy.
  The caller keeps it, reuses it in later runs, or frees it.

A bound request (:class:`~crossrt.runtime.request.Request`, ``model.request(inputs,
outputs)``) is checked once: :meth:`OutputBinder.bind` makes its :class:`Binding`, each
instance's program bound once to those tensors (:meth:`Instance.bind`), and the request runs
that binding while what it holds is unchanged (:meth:`Binding.holds`), as a caller of ONNX
Runtime's IOBinding binds once. A ``run(inputs, outputs)`` is checked every call. This is
the only place calls are prepared for repeating: drivers keep no cache of their own.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import dtypes
from ..drivers.base import DeviceArray
from ..errors import InvalidArgumentError, InvalidInputError
from ..model import TensorSpec
from .inputs import InputChecker
from .memory.allocation import host_contiguous
from .memory.allocator import Allocator, allocator_for, count_copy
from .memory.storage import Storage
from .memory.tensor import Tensor, host_view_of, is_described, live_storage, wrap_storage
from .memory.tensordesc import Placement
from .memory.tensorset import TensorSet
from .memory.transfer import H2D, Transfers, device_array, release, release_made, to_host

if TYPE_CHECKING:
    from .instance import Instance

_BOUND, _COPY, _ALLOCATE = 0, 1, 2

# Per input then per output of a checked call: (name, host view of a tensor, None) or (name,
# array, (shape, dtype)).
_Kept = tuple[str, np.ndarray, tuple[tuple[int, ...], np.dtype[Any]] | None]


class Binding:
    """A bound request's checked inputs and outputs, bound in place, with each instance's
    prepared call.

    Attributes:
        feed: the inputs as the checks passed them to the engine.
        bound: the output arrays bound in place.
        calls: per instance, its call bound to ``feed`` and ``bound`` (:meth:`call_on`).
    """

    __slots__ = ("bound", "calls", "feed", "kept", "sizes")

    def __init__(
        self,
        sizes: tuple[int, int],
        kept: tuple[_Kept, ...],
        feed: dict[str, Any],
        bound: dict[str, np.ndarray],
    ) -> None:
        self.sizes = sizes
        self.kept = kept
        self.feed = feed
        self.bound = bound
        self.calls: dict[Instance, Callable[[], Any]] = {}

    def holds(self, inputs: dict[str, Any], outputs: dict[str, Any]) -> bool:
        """Whether ``inputs`` and ``outputs`` (the request's) are still what was checked.

        A tensor's host view is made by that tensor alone and replaced whenever its dtype,
        shape or memory change (``set_shape``, ``attach_buffer``, ``detach``, ``free``): the
        same view means the same tensor, which the checks would pass again and bind to the
        same bytes. An array is the same object with the same shape and dtype (both can be
        set in place).
        """
        if (len(inputs), len(outputs)) != self.sizes:
            return False
        kept = self.kept
        # Written out by hand, not zipped: this runs on every bound call.
        i = 0
        for given in (inputs, outputs):
            for name, value in given.items():
                was, same, array = kept[i]
                if array is None:
                    if type(value) is not Tensor or value._view is not same:
                        return False
                elif value is not same or value.shape != array[0] or value.dtype is not array[1]:
                    return False
                if name != was:
                    return False
                i += 1
        return True

    def call_on(
        self, inst: Instance, direct: bool, execute: Callable[..., Any] | None = None
    ) -> Callable[[], Any]:
        """The call that runs this binding on ``inst``, prepared on first use: where what a
        run calls on ``inst`` (``execute``, default :meth:`Instance.run_checked`) is its single
        program with nothing around it (``direct``), the program's own binding
        (:meth:`Instance.bind`); else ``execute`` on these arrays."""
        call = self.calls.get(inst)
        if call is None:
            if direct:
                call = inst.bind(self.feed, self.bound)
            else:
                run = inst.run_checked if execute is None else execute
                call = functools.partial(run, self.feed, self.bound)
            self.calls[inst] = call
        return call


class OutputBinder:
    """Prepares and finishes the outputs of one model's runs.

    Args:
        specs: the model's outputs.
        checker: the model's input checker (it also checks output arrays).
        allocator: returns the allocator of the model's device.
        owner: the model's memory owner key.
        transfers: where the model's moves between memories are counted.
        resident: the model's programs take device memory (a device tensor given for an
            output is bound in place on its device).
    """

    def __init__(
        self,
        specs: Sequence[TensorSpec],
        checker: InputChecker,
        allocator: Callable[[], Allocator],
        owner: str,
        transfers: Transfers,
        resident: bool = False,
    ) -> None:
        self._transfers = transfers
        self._resident = resident
        self._specs = tuple(specs)
        self._by_name = {s.name: s for s in specs}
        self._checker = checker
        self._allocator = allocator
        self._owner = owner
        self._static: dict[str, tuple[tuple[int, ...], int]] = {}
        for s in specs:
            if s.kind == "tensor" and s.is_static and s.dtype is not None and s.dtype.itemsize:
                shape = tuple(d for d in s.shape or () if isinstance(d, int))
                nbytes = math.prod(shape) * s.dtype.itemsize
                self._static[s.name] = (shape, nbytes)

    def run(
        self, execute: Callable[..., dict[str, Any]], feed: dict[str, Any], outputs: Any
    ) -> Any:
        """Run ``execute`` with ``outputs`` bound; return the results (the set, for a set)."""
        if type(outputs) is dict:  # all arrays: the path as it was before tensors, kept fast
            for value in outputs.values():
                if type(value) is not np.ndarray:
                    break
            else:
                arrays = self._checker.check_outputs(outputs, self._by_name)
                return self._execute(execute, feed, arrays)
        bound, after, is_set = self._prepare(outputs)
        # A resident model's plain call returns host arrays: pass the (maybe empty) bindings.
        result = self._execute(execute, feed, bound) if bound or self._resident else execute(feed)
        for spec, how, tensor in after:
            if how == _BOUND:
                result[spec.name] = tensor
            elif how == _COPY:
                assert tensor is not None
                result[spec.name] = self._copy_into(spec, tensor, result[spec.name])
            else:
                result[spec.name] = self._adopt(spec, result[spec.name])
        if not is_set:
            return result
        assert isinstance(outputs, TensorSet)
        for name, value in result.items():
            outputs.add(name, value)
        return outputs

    def bind(self, inputs: Any, feed: dict[str, Any], outputs: Any) -> Binding | None:
        """A :class:`Binding` of a request's ``inputs`` (``feed``: as the checks passed them)
        and ``outputs``, checked now; ``None`` when it cannot be repeated as it is (see
        :meth:`_checked`): such a request is checked on every run."""
        if type(outputs) is not dict:
            return None
        if all(type(value) is np.ndarray for value in outputs.values()):
            arrays = self._checker.check_outputs(outputs, self._by_name)
            return self._checked(inputs, feed, outputs, arrays, [])
        bound, after, _ = self._prepare(outputs)
        return self._checked(inputs, feed, outputs, bound, after)

    def _prepare(
        self, outputs: Any
    ) -> tuple[dict[str, np.ndarray], list[tuple[TensorSpec, int, Tensor | None]], bool]:
        """``outputs`` checked: the arrays to bind, what to do with each output after the
        run (bound, copied in, allocated), and whether they are a :class:`TensorSet`."""
        # isinstance against the mapping ABCs costs ~0.5 µs each: a plain dict skips them.
        plain = type(outputs) is dict
        is_set = not plain and isinstance(outputs, TensorSet)
        if not plain and not is_set and not isinstance(outputs, Mapping):
            raise InvalidArgumentError(
                f"outputs= must be a dict of name -> array/Tensor/None or a TensorSet, not "
                f"{type(outputs).__name__}"
            )
        bound: dict[str, np.ndarray] = {}
        after: list[tuple[TensorSpec, int, Tensor | None]] = []
        for name, value in outputs.items():
            if value is None or isinstance(value, Tensor):
                spec = self._spec(name)
                if value is None:
                    after.append((spec, _ALLOCATE, None))
                elif (view := self._bind(spec, value)) is not None:
                    bound[name] = view
                    after.append((spec, _BOUND, value))
                else:
                    after.append((spec, _COPY, value))
            else:
                bound.update(self._checker.check_outputs({name: value}, self._by_name))
        if is_set:
            after += [(s, _ALLOCATE, None) for s in self._specs if s.name not in outputs]
        return bound, after, is_set

    def _execute(
        self, execute: Callable[..., dict[str, Any]], feed: dict[str, Any], bound: dict[str, Any]
    ) -> dict[str, Any]:
        """``execute`` into the arrays bound; when it fails, an array of the wrong shape for a
        dynamic output is named (:meth:`_explain`)."""
        try:
            return execute(feed, bound)
        except Exception:
            self._explain(execute, feed, bound)
            raise

    def _explain(
        self, execute: Callable[..., dict[str, Any]], feed: dict[str, Any], bound: dict[str, Any]
    ) -> None:
        """Raise INVALID naming the bytes needed when an array bound to a dynamic output has
        another shape than this run's result, which engines refuse in their own words (ONNX
        Runtime: FAILURE, with its internals). Only a run can tell the result's shape: the
        failed run is made once more, unbound, on this error path only."""
        dynamic = {
            name: array
            for name, array in bound.items()
            if name not in self._static and type(array) is np.ndarray
        }
        if not dynamic:
            return
        try:
            made = execute(feed)
        except Exception:  # it fails unbound too: the buffers are not the cause
            return
        try:
            for name, array in dynamic.items():
                shape = getattr(made.get(name), "shape", None)
                if shape is not None and tuple(shape) != array.shape:
                    raise _wrong_shape(name, tuple(shape), array) from None
        finally:
            release_made(made, None)  # device results nobody receives

    def _checked(
        self,
        inputs: Any,
        feed: dict[str, Any],
        outputs: dict[str, Any],
        bound: dict[str, np.ndarray],
        after: list[tuple[TensorSpec, int, Tensor | None]],
    ) -> Binding | None:
        """A binding for a bound request, when every output is an array or a tensor bound in
        place and every input an array or a host tensor that the engine reads where it lies."""
        if type(inputs) is not dict or len(outputs) != len(self._specs):
            return None  # a repeat returns exactly the outputs given: they must be all
        if after and len(after) != len(outputs):
            return None
        kept: list[_Kept] = []
        for name, value in inputs.items():
            checked = feed[name]
            if type(value) is Tensor and checked is value._view and checked is not None:
                kept.append((name, checked, None))
            elif type(value) is np.ndarray and checked is value:
                kept.append((name, value, (value.shape, value.dtype)))
            else:  # converted, or staged (a copy made each run): checked each time
                return None
        if not after:  # every output an array, bound as it is
            for name, value in outputs.items():
                kept.append((name, value, (value.shape, value.dtype)))
        for spec, how, _ in after:
            if how != _BOUND:
                return None
            kept.append((spec.name, bound[spec.name], None))
        return Binding((len(inputs), len(outputs)), tuple(kept), feed, bound)

    def _spec(self, name: str) -> TensorSpec:
        spec = self._by_name.get(name)
        if spec is None:
            raise InvalidInputError(
                f"unknown output {name!r} in outputs=; the model's outputs are "
                f"{', '.join(self._by_name) or 'none'}",
                details={"output": name},
            )
        if spec.kind != "tensor" or spec.dtype is None or not spec.dtype.itemsize:
            raise InvalidInputError(
                f"output {name!r} is {spec.describe()}, which no Tensor can hold; leave it out "
                "of outputs= to receive it as a Python value",
                details={"output": name},
            )
        return spec

    def _bind(self, spec: TensorSpec, tensor: Tensor) -> Any:
        """The array to bind for ``tensor`` (a device array for a resident model's device
        tensor), or ``None`` to copy the result in after the run."""
        storage = live_storage(tensor, "run")
        if not is_described(tensor) and spec.dtype is not None:
            # Raw memory (Tensor.allocate, nrt_tensor_allocate) takes the output's dtype.
            tensor.set_shape((tensor.size // spec.dtype.itemsize,), spec.dtype)
        if tensor.dtype is not spec.dtype and tensor.dtype != spec.dtype:
            raise InvalidInputError(
                f"output tensor {spec.name!r} is {tensor.dtype}, the output is {spec.describe()}; "
                f"pass a {spec.dtype} tensor",
                details={"output": spec.name, "expected_dtype": str(spec.dtype)},
            )
        storage.check_writable()
        static = self._static.get(spec.name)
        if static is None or (storage.host is None and not self._resident):
            return None
        shape, nbytes = static
        if tensor.size < nbytes:
            raise _too_small(spec.name, spec.describe(), nbytes, tensor)
        if tensor.shape != shape:
            tensor.set_shape(shape)
        if storage.host is None:
            return device_array(tensor)
        return host_view_of(tensor)

    def _adopt(self, spec: TensorSpec, produced: Any) -> Tensor:
        """The engine's result as a tensor charged to the model, without a copy where the
        model's device is host memory or the result lies in device memory already."""
        if isinstance(produced, DeviceArray):
            return self._adopt_device(spec, produced)
        array = np.asarray(produced)
        if not array.flags.c_contiguous:
            array = host_contiguous(array, f"output {spec.name!r}")
            count_copy(array.nbytes)
        raw = array.reshape(-1).view(np.uint8)
        allocator = self._allocator()
        owner, name = self._owner, spec.name
        if allocator.coherent:
            allocation = allocator.adopt(array, raw.size, owner=owner, name=name)
            storage = Storage(raw.size, host=raw, allocation=allocation)
        else:
            allocation = allocator.allocate(raw.size, owner=owner, name=name)
            storage = Storage(raw.size, allocation=allocation)
            storage.write_from(0, raw)
            count_copy(raw.size)
            self._transfers.count(H2D, raw.size)
        dtype = dtypes.from_numpy(array.dtype)
        device = allocator.device.id
        return wrap_storage(
            storage, dtype, array.shape, name=name, placement=Placement.DEVICE, device=device
        )

    def _adopt_device(self, spec: TensorSpec, produced: DeviceArray) -> Tensor:
        """A program's device output as a tensor charged to the model: nothing moves."""
        allocator = self._allocator()
        if allocator.device.id != produced.device:  # a node on another device made it
            allocator = allocator_for(produced.device)
        try:
            allocation = allocator.adopt(
                produced.buffer,
                produced.nbytes,
                owner=self._owner,
                name=spec.name,
                from_driver=True,
            )
        except BaseException:
            release(produced)
            raise
        storage = Storage(produced.nbytes, allocation=allocation)
        return wrap_storage(
            storage,
            dtypes.from_numpy(produced.dtype),
            produced.shape,
            name=spec.name,
            placement=Placement.DEVICE,
            device=produced.device,
        )

    def _copy_into(self, spec: TensorSpec, tensor: Tensor, produced: Any) -> Tensor:
        if isinstance(produced, DeviceArray):
            host = to_host(produced, self._transfers)
            release(produced)
            produced = host
        array = host_contiguous(produced, f"output {spec.name!r}")
        if tensor.size < array.nbytes:
            shape = "[" + ",".join(map(str, array.shape)) + "]"
            raise _too_small(spec.name, f"{spec.dtype} {shape}", array.nbytes, tensor)
        tensor.set_shape(array.shape)
        tensor.write(array)
        count_copy(array.nbytes)
        if not tensor.is_host:
            self._transfers.count(H2D, array.nbytes)
        return tensor


def _wrong_shape(name: str, shape: tuple[int, ...], array: np.ndarray) -> InvalidArgumentError:
    needed = math.prod(shape) * array.itemsize
    want = "[" + ",".join(map(str, shape)) + "]"
    given = "[" + ",".join(map(str, array.shape)) + "]"
    return InvalidArgumentError(
        f"output {name!r} is {array.dtype} {want} in this run ({needed} bytes) but the array "
        f"given for it is {given} ({array.nbytes} bytes); pass an array of shape {want}, or "
        "None to let the runtime allocate it (a dynamic output's shape is known after the run: "
        "model.tensors.output_shapes())",
        details={"output": name, "needed": needed, "size": array.nbytes, "shape": list(shape)},
    )


def _too_small(name: str, what: str, needed: int, tensor: Tensor) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"output {name!r} is {what} ({needed} bytes) but the tensor given holds {tensor.size} "
        f"bytes; pass a tensor of at least {needed} bytes, or None to let the runtime "
        "allocate it",
        details={"output": name, "needed": needed, "size": tensor.size},
    )
