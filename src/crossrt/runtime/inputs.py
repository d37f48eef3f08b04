"""Checking inference inputs before they reach an engine.

The checks are precomputed per model so that a call costs a few attribute lookups per input.
Every refusal is an ``EXEC_BAD_INPUT`` error naming the input, what was expected, what was
given, and the fix.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

import numpy as np

from ..errors import InvalidArgumentError, InvalidInputError
from ..model import TensorSpec
from .memory.allocator import count_copy
from .memory.tensor import Tensor, host_view_of
from .memory.transfer import D2H, Transfers, device_array


class InputChecker:
    """Validates and normalises the inputs of one model.

    Args:
        specs: the model's inputs.
        transfers: where a copy of a device tensor to the host is counted.
        keep_device: hand tensors in device memory over as :class:`DeviceArray` values (the
            model's programs take device memory) instead of copying them to the host.
    """

    def __init__(
        self,
        specs: Sequence[TensorSpec],
        *,
        transfers: Transfers | None = None,
        keep_device: bool = False,
    ) -> None:
        self._transfers = transfers
        # How a tensor in device memory is handed over when the model's programs take device
        # memory (None: copied to the host instead).
        self._device_array = device_array if keep_device else None
        self.specs = tuple(specs)
        self.names = tuple(s.name for s in specs)
        self._name_set = frozenset(self.names)
        self._count = len(self.names)
        # (name, spec, numpy dtype or None, exact shape or None, rank or None)
        self._plan: list[tuple[str, TensorSpec, Any, tuple[int, ...] | None, int | None]] = []
        for s in specs:
            np_dtype = s.dtype.numpy if (s.kind == "tensor" and s.dtype) else None
            exact = (
                tuple(d for d in s.shape if isinstance(d, int))
                if s.is_static and s.shape is not None
                else None
            )
            assert s.shape is None or exact is None or len(exact) == len(s.shape)
            self._plan.append((s.name, s, np_dtype, exact, s.rank if s.kind == "tensor" else None))

    def checked_feed(self, inputs: Any) -> dict[str, Any]:
        """Return ``{name: array}`` ready for the engine, or raise InvalidInputError.

        Values may be arrays, :class:`Tensor` objects (viewed without a copy when in host
        memory) or anything ``np.asarray`` takes; ``inputs`` may be a dict, a
        :class:`TensorSet`, or a list in input order.
        """
        if type(inputs) is dict and len(inputs) == self._count:
            # As many names as the model's inputs: each one found below means the same names
            # (a set comparison of the keys cost 0.13 µs of a tiny model's 5.5 µs call).
            feed = inputs.copy()
        else:
            feed = self.named(inputs)
        for name, spec, np_dtype, exact, rank in self._plan:
            try:
                value = feed[name]
            except KeyError:
                self._mismatch(inputs)  # names the unknown input, else the missing one
            if np_dtype is None:
                continue  # sequences, optionals, maps, untyped: the engine checks them
            if type(value) is not np.ndarray:
                tensor = value if type(value) is Tensor else None
                if tensor is not None and not tensor._described and exact is not None:
                    raw = _raw_input(spec, tensor, np_dtype, exact)
                    if raw is not None:
                        feed[name] = raw
                        continue
                view = tensor._view if tensor is not None else None  # a host tensor's view
                value = feed[name] = view if view is not None else self._coerce(spec, value)
            if value.dtype != np_dtype and not _same_string(value.dtype, np_dtype):
                raise _wrong_dtype(spec, value)
            if exact is not None:
                if value.shape != exact:
                    raise _wrong_shape(spec, value)
            elif rank is not None and value.ndim != rank:
                raise _wrong_shape(spec, value)
            elif spec.shape is not None:
                for want, got in zip(spec.shape, value.shape, strict=True):
                    if isinstance(want, int) and want != got:
                        raise _wrong_shape(spec, value)
        return feed

    def check_outputs(
        self, outputs: Mapping[str, Any], by_name: Mapping[str, TensorSpec]
    ) -> dict[str, np.ndarray]:
        """Check preallocated output buffers against the outputs ``by_name``: known name,
        dtype, static dims, C-contiguous."""
        for name, buf in outputs.items():
            spec = by_name.get(name)
            if spec is None:
                raise InvalidInputError(
                    f"unknown output {name!r} in outputs=; the model's outputs are "
                    f"{', '.join(by_name) or 'none'}",
                    details={"output": name},
                )
            if isinstance(buf, np.ndarray) and _shape_contradicts(spec, buf):
                raise _wrong_size(spec, buf)
            problem = _buffer_problem(spec, buf)
            if problem:
                raise InvalidInputError(
                    f"output buffer {name!r}: {problem}; pass a C-contiguous, writeable numpy "
                    f"array of {spec.describe()}",
                    details={"output": name},
                )
        return dict(outputs)

    def named(self, inputs: Any) -> dict[str, Any]:
        """``inputs`` (a dict, a :class:`TensorSet`, a list in input order, one value) as
        ``{input name: value}``, unchecked."""
        if isinstance(inputs, dict):
            if inputs.keys() == self._name_set:
                return dict(inputs)
            self._mismatch(inputs)
        if isinstance(inputs, np.ndarray | Tensor):
            inputs = [inputs]
        if isinstance(inputs, list | tuple):
            if len(inputs) != len(self.names):
                raise InvalidInputError(
                    f"got {len(inputs)} inputs, the model takes {len(self.names)}: "
                    f"{self._listing()}; pass one value per input, in this order, or a dict",
                    details={"expected": list(self.names), "given_count": len(inputs)},
                )
            return dict(zip(self.names, inputs, strict=True))
        if hasattr(inputs, "keys"):
            return self.named(dict(inputs))
        raise InvalidInputError(
            f"inputs must be a dict of name -> array or a list of arrays, not "
            f"{type(inputs).__name__}; the model takes {self._listing()}"
        )

    def _mismatch(self, inputs: dict[str, Any]) -> NoReturn:
        """Raise InvalidInputError for inputs whose names are not the model's."""
        unknown = [k for k in inputs if k not in self._name_set]
        if unknown:
            name = unknown[0]
            close = difflib.get_close_matches(str(name), self.names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise InvalidInputError(
                f"unknown input {name!r}; the model takes {self._listing()}{hint}",
                details={"input": name, "expected": list(self.names)},
            )
        missing = next(s for s in self.specs if s.name not in inputs)
        raise InvalidInputError(
            f"missing input {missing.name!r} ({missing.describe()}); the model takes "
            f"{self._listing()}; give a value for each",
            details={"input": missing.name, "expected": missing.describe()},
        )

    def _coerce(self, spec: TensorSpec, value: Any) -> np.ndarray:
        assert spec.dtype is not None
        unwrap = _TENSOR_LIKE.get(type(value))
        if unwrap is not None:
            value = unwrap(value)
        if value is None:  # np.asarray(None) is a 0-d object array: refused for its dtype
            raise InvalidInputError(
                f"input {spec.name!r} is None; pass an array of {spec.describe()}",
                details={"input": spec.name},
            )
        if isinstance(value, np.ndarray):
            return value  # a subclass (memmap, matrix): checked like any array
        if isinstance(value, Tensor):
            # A host tensor is passed as a view of its memory. Device memory is handed over as
            # it is when the model's programs take device memory, else copied to the host.
            view = host_view_of(value)
            if view is not None:
                return view
            if self._device_array is not None:
                device = self._device_array(value)
                assert device is not None
                return device  # type: ignore[return-value]  # checked like an array
            array = value.numpy()
            count_copy(array.nbytes)
            if self._transfers is not None:
                self._transfers.count(D2H, array.nbytes)
            return array
        try:
            array = np.asarray(value)
        except Exception as exc:
            raise InvalidInputError(
                f"input {spec.name!r}: cannot turn {type(value).__name__} into an array "
                f"({exc}); pass a numpy array of {spec.describe()}",
                details={"input": spec.name},
            ) from None
        # Plain Python numbers and lists carry no dtype of their own: take the model's, as long
        # as no value changes (1.5 -> int truncates, 300 -> uint8 wraps).
        wanted = spec.dtype.numpy
        numeric = array.dtype.kind in "iufb" and wanted.kind in "iufb"
        if not numeric or isinstance(value, np.generic):
            return array
        converted = array.astype(wanted)
        if wanted.kind in "iub" and not np.array_equal(converted.astype(array.dtype), array):
            raise InvalidInputError(
                f"input {spec.name!r}: the values given do not fit {spec.dtype} without change "
                f"(fractions or out of range); pass a numpy array of {spec.describe()}",
                details={"input": spec.name, "expected_dtype": spec.dtype.name},
            )
        return converted

    def _listing(self) -> str:
        return ", ".join(f"{s.name} ({s.describe()})" for s in self.specs) or "no inputs"


_TENSOR_LIKE: dict[type, Callable[[Any], Tensor]] = {}


def feed_as_tensor(kind: type, tensor_of: Callable[[Any], Tensor]) -> None:
    """Let values of type ``kind`` (a layer's own wrapper of a :class:`Tensor`, such as
    ``crossrt.onnxruntime.OrtValue``) be fed to ``run`` as the tensor ``tensor_of`` gives:
    the check looks them up only for values that are not arrays, so a caller that feeds
    arrays pays nothing for it (a scan of every feed for wrappers cost 0.1 µs a call)."""
    _TENSOR_LIKE[kind] = tensor_of


def _buffer_problem(spec: TensorSpec, buf: Any) -> str | None:
    if not isinstance(buf, np.ndarray):
        return f"{type(buf).__name__} is not a numpy array"
    if spec.dtype is not None and buf.dtype != spec.dtype.numpy:
        return f"dtype is {buf.dtype}, the output is {spec.dtype}"
    if spec.shape is not None:
        if buf.ndim != len(spec.shape):
            return f"shape is {_shape_str(buf.shape)}, the output is {spec.shape_str()}"
        for want, got in zip(spec.shape, buf.shape, strict=True):
            if isinstance(want, int) and want != got:
                return f"shape is {_shape_str(buf.shape)}, the output is {spec.shape_str()}"
    if not buf.flags.c_contiguous:
        return "it is not C-contiguous"
    if not buf.flags.writeable:
        return "it is read-only"
    return None


def _shape_contradicts(spec: TensorSpec, buf: np.ndarray) -> bool:
    """Whether ``buf``'s shape contradicts the output's rank or static dimensions."""
    if spec.shape is None:
        return False
    if buf.ndim != len(spec.shape):
        return True
    return any(isinstance(w, int) and w != g for w, g in zip(spec.shape, buf.shape, strict=True))


def _wrong_size(spec: TensorSpec, buf: np.ndarray) -> InvalidArgumentError:
    """An array that cannot hold the output: INVALID, as for a tensor too small, naming the
    bytes the output needs when its shape is static (else its shape)."""
    given = f"{buf.dtype} {_shape_str(buf.shape)} ({buf.nbytes} bytes)"
    details: dict[str, Any] = {"output": spec.name, "size": buf.nbytes}
    if spec.is_static and spec.dtype is not None and spec.dtype.itemsize:
        dims = [d for d in spec.shape or () if isinstance(d, int)]
        needed = int(np.prod(dims)) * spec.dtype.itemsize
        details["needed"] = needed
        want = f"{spec.describe()} ({needed} bytes)"
        fix = f"pass an array of {spec.describe()}, {needed} bytes"
    else:
        want = f"{spec.describe()} (its dynamic dimensions are known after the run)"
        fix = f"pass an array of shape {spec.shape_str()} with the dimensions of this run"
    return InvalidArgumentError(
        f"output buffer {spec.name!r} is {given}; the output is {want}: {fix}, or None to let "
        "the runtime allocate it",
        details=details,
    )


def _same_string(given: np.dtype[Any], wanted: np.dtype[Any]) -> bool:
    return wanted.kind == "O" and given.kind in "OUS"


def _shape_str(shape: tuple[int, ...]) -> str:
    return "[" + ",".join(map(str, shape)) + "]"


def _raw_input(
    spec: TensorSpec, tensor: Tensor, np_dtype: Any, shape: tuple[int, ...]
) -> np.ndarray | None:
    """Raw memory (``Tensor.allocate``, ``nrt_tensor_allocate``: untyped bytes) read as the
    input it is given for, as the seeds' runtimes take it: by its size in bytes; ``None`` for
    a tensor typed by its buffer (``Tensor.from_buffer``) or already of the input's form."""
    if tensor.dtype.name != "uint8" or (np_dtype == np.uint8 and tensor.shape == shape):
        return None
    needed = int(np.prod(shape)) * np.dtype(np_dtype).itemsize
    if tensor.size != needed:
        raise InvalidInputError(
            f"input {spec.name!r}: the raw tensor holds {tensor.size} bytes, the input "
            f"{spec.describe()} takes {needed}; allocate {needed} bytes",
            details={"input": spec.name, "expected_bytes": needed, "given_bytes": tensor.size},
        )
    data: np.ndarray = tensor.numpy().view(np_dtype).reshape(shape)
    return data


def _wrong_dtype(spec: TensorSpec, value: np.ndarray) -> InvalidInputError:
    assert spec.dtype is not None
    return InvalidInputError(
        f"input {spec.name!r}: expected {spec.describe()}, got {value.dtype} "
        f"{_shape_str(value.shape)}; cast it with {_cast(spec.dtype.numpy)}",
        details={
            "input": spec.name,
            "expected_dtype": spec.dtype.name,
            "given_dtype": str(value.dtype),
        },
    )


def _cast(dtype: np.dtype[Any]) -> str:
    # np.object was removed in NumPy 2 (deprecated before): a string tensor is plain `object`.
    if dtype.kind == "O":
        return ".astype(object), its elements str"
    return f".astype(np.{dtype.name})"


def _wrong_shape(spec: TensorSpec, value: np.ndarray) -> InvalidInputError:
    assert spec.shape is not None
    if value.ndim != len(spec.shape):
        fix = f"give it {len(spec.shape)} dimensions (reshape, or add a batch axis with x[None])"
    else:
        axis = next(
            i
            for i, (w, g) in enumerate(zip(spec.shape, value.shape, strict=True))
            if isinstance(w, int) and w != g
        )
        fix = f"dimension {axis} must be {spec.shape[axis]}; resize, crop or pad the input"
    return InvalidInputError(
        f"input {spec.name!r}: expected {spec.describe()}, got {value.dtype} "
        f"{_shape_str(value.shape)}; {fix}",
        details={
            "input": spec.name,
            "expected_shape": list(spec.shape),
            "given_shape": list(value.shape),
        },
    )


def output_names_checked(
    model: str, known: Sequence[str], output_names: Any, buffers: Any = None
) -> tuple[str, ...]:
    """``output_names`` of ``run(output_names=)`` checked against model ``model``'s outputs
    ``known``: distinct output names, and ``buffers`` (``outputs=``) a dict for those names
    only (a buffer for another output would never be written).

    Raises:
        InvalidInputError: naming the model's outputs (and the one meant, for a typo).
    """
    names = tuple(output_names) if isinstance(output_names, list | tuple) else ()
    if not names or not all(type(n) is str for n in names) or len(set(names)) < len(names):
        raise InvalidInputError(
            f"output_names={output_names!r}: give a list of distinct output names of "
            f"model {model!r} ({', '.join(known)}), or None for every output",
            details={"outputs": list(known)},
        )
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise InvalidInputError(
                f"model {model!r} has no output {name!r}; its outputs are {', '.join(known)}{hint}",
                details={"output": name, "outputs": list(known)},
            )
    if buffers is not None and not isinstance(buffers, dict):
        raise InvalidInputError(
            "output_names= takes outputs= as a dict of output name to buffer, not a "
            f"{type(buffers).__name__}",
            details={"outputs": list(known)},
        )
    for name in buffers or ():
        if name not in names:
            raise InvalidInputError(
                f"outputs= gives a buffer for output {name!r}, which output_names= does "
                f"not ask for ({', '.join(names)}); ask for it too, or drop its buffer",
                details={"output": name},
            )
    return names
