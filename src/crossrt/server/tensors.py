"""KServe v2 tensors to NumPy and back.

Every size a client declares is checked against the bytes it actually sent (or the region
slice it named) and against the model's declared input BEFORE anything is allocated: a
request declaring a [2**40, 2**40] tensor is answered INVALID_ARGUMENT without a byte being
reserved. Raw contents become arrays without a copy; shared-memory slices are read once into
the array the model takes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb

from .. import dtypes
from ..dtypes import DType
from ..model import TensorSpec
from .forms import is_json_form, json_elements
from .status import ServiceError

# KServe datatype -> the typed field of InferTensorContents that may carry it.
_TYPED_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}

SharedRead = Callable[[str, int, int], np.ndarray]
"""``(region, offset, byte_size) -> uint8 array``: bytes of a registered region, checked."""
SharedWrite = Callable[[str, int, np.ndarray], None]
"""``(region, offset, array)``: write an array's bytes into a registered region, checked."""


def bad(message: str) -> ServiceError:
    """An INVALID_ARGUMENT refusal."""
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, message)


def kserve_type(spec: TensorSpec) -> str:
    """The KServe datatype of a model's input or output, or an UNIMPLEMENTED refusal."""
    if spec.dtype is None or spec.dtype.kserve is None:
        raise ServiceError(
            grpc.StatusCode.UNIMPLEMENTED,
            f"tensor {spec.name!r} is {spec.describe()}, which crossrt serve does not carry "
            "over KServe (a type without a KServe name); run this model in-process",
        )
    return spec.dtype.kserve


def decode_bytes(data: Any, count: int, what: str) -> np.ndarray:
    """``count`` KServe BYTES elements (each a 4-byte little-endian length, then that many
    bytes) as an object array of ``str``: ONNX strings are UTF-8 text. Every length is checked
    against the bytes there before anything is kept.

    Raises:
        ServiceError: INVALID_ARGUMENT for lengths that overrun the data, bytes left over,
            or an element that is not UTF-8.
    """
    view = memoryview(data).cast("B")
    if count * 4 > len(view):
        raise bad(
            f"{what}: {len(view)} bytes cannot hold {count} BYTES elements (each starts with "
            "a 4-byte length)"
        )
    out = np.empty(count, dtype=object)
    at = 0
    for i in range(count):
        if at + 4 > len(view):
            raise bad(f"{what}: the data ends before BYTES element {i} of {count}")
        n = int.from_bytes(view[at : at + 4], "little")
        at += 4
        if n > len(view) - at:
            raise bad(f"{what}: BYTES element {i} declares {n} bytes but {len(view) - at} are left")
        try:
            out[i] = bytes(view[at : at + n]).decode("utf-8")
        except UnicodeDecodeError:
            raise bad(
                f"{what}: BYTES element {i} is not UTF-8 text, which ONNX strings are"
            ) from None
        at += n
    if at != len(view):
        raise bad(f"{what}: {len(view) - at} bytes after the last of {count} BYTES elements")
    return out


def encode_bytes(array: np.ndarray) -> bytes:
    """An array of strings (``str`` as UTF-8, or ``bytes``) as KServe BYTES."""
    parts: list[bytes] = []
    for value in array.reshape(-1):
        raw = value if isinstance(value, bytes) else str(value).encode("utf-8")
        parts += (len(raw).to_bytes(4, "little"), raw)
    return b"".join(parts)


def shared_memory_params(params: Mapping[str, pb.InferParameter]) -> tuple[str, int, int] | None:
    """``(region, offset, byte_size)`` when the tensor names a shared-memory region."""
    if "shared_memory_region" not in params:
        return None
    region = params["shared_memory_region"].string_param
    if "shared_memory_byte_size" not in params:
        raise bad(
            f"shared_memory_region {region!r} without shared_memory_byte_size; give both "
            "(tritonclient: set_shared_memory(region, byte_size, offset))"
        )
    size = _param_int(params["shared_memory_byte_size"], "shared_memory_byte_size")
    offset = 0
    if "shared_memory_offset" in params:
        offset = _param_int(params["shared_memory_offset"], "shared_memory_offset")
    return region, offset, size


def _param_int(param: pb.InferParameter, name: str) -> int:
    which = param.WhichOneof("parameter_choice")
    value = getattr(param, which) if which else None
    if which not in ("int64_param", "uint64_param") or not isinstance(value, int) or value < 0:
        raise bad(f"parameter {name} must be a non-negative integer, got {value!r}")
    return value


def _shape(tensor: Any, spec: TensorSpec) -> tuple[int, ...]:
    """The declared shape, checked against the model's input."""
    shape = tuple(tensor.shape)  # int64s: Python ints
    if shape == spec.shape:  # the common case: a static input, sent as declared
        return shape
    if shape and min(shape) < 0:
        raise bad(f"input {spec.name!r}: shape {list(shape)} has a negative dimension")
    if spec.shape is not None:
        ok = len(shape) == len(spec.shape) and all(
            not isinstance(want, int) or want == got
            for want, got in zip(spec.shape, shape, strict=True)
        )
        if not ok:
            raise bad(
                f"input {spec.name!r}: expected shape {spec.shape_str()}, got {list(shape)}; "
                "send the shape the model declares (ModelMetadata lists it)"
            )
    return shape


def decode_inputs(
    request: pb.ModelInferRequest,
    specs: Sequence[TensorSpec],
    read: SharedRead,
) -> dict[str, np.ndarray]:
    """The request's inputs as arrays, checked against ``specs`` (the model's inputs).

    Raises:
        ServiceError: INVALID_ARGUMENT for an unknown, missing or repeated input, a wrong
            datatype, a shape the model does not take, contents of the wrong length (for
            BYTES: element lengths that overrun the data, or text that is not UTF-8).
    """
    by_name = {s.name: s for s in specs}
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise bad(
            f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs: give every "
            "input's bytes in raw_input_contents, in the order of inputs, or none"
        )
    feed: dict[str, np.ndarray] = {}
    for i, tensor in enumerate(request.inputs):
        spec = by_name.get(tensor.name)
        if spec is None:
            raise bad(
                f"model {request.model_name!r} has no input {tensor.name!r}; its inputs: "
                f"{', '.join(by_name) or 'none'}"
            )
        if tensor.name in feed:
            raise bad(f"input {tensor.name!r} is given twice")
        want = kserve_type(spec)
        if tensor.datatype.upper() != want:
            raise bad(
                f"input {spec.name!r}: expected datatype {want}, got {tensor.datatype!r}; "
                f"send {want} ({spec.describe()})"
            )
        dtype: DType = dtypes.from_kserve(want)
        shape = _shape(tensor, spec)
        count = math.prod(shape)  # Python ints: a huge shape is a big number, not a buffer
        if want == "BYTES":
            strings = _bytes_input(tensor, raw[i] if raw else None, count, read)
            feed[spec.name] = strings.reshape(shape)
            continue
        nbytes = count * dtype.itemsize
        region = shared_memory_params(tensor.parameters)
        if region is not None:
            name, offset, size = region
            if size != nbytes:
                raise bad(
                    f"input {spec.name!r}: shared_memory_byte_size {size} but {dtype} "
                    f"{list(shape)} is {nbytes} bytes; make them agree"
                )
            data: Any = read(name, offset, size)
        elif raw:
            data = raw[i]
            if len(data) != nbytes:
                raise bad(
                    f"input {spec.name!r}: raw_input_contents holds {len(data)} bytes but "
                    f"{dtype} {list(shape)} is {nbytes} bytes; send exactly the tensor's bytes"
                )
        else:
            field = _TYPED_FIELD.get(want)
            values = getattr(tensor.contents, field) if field else ()
            if len(values) != count:
                how = "" if field else f" ({want} has no typed field: send raw_input_contents)"
                raise bad(
                    f"input {spec.name!r}: {len(values)} values in contents for {list(shape)} "
                    f"({count} values){how}"
                )
            feed[spec.name] = np.asarray(values, dtype=dtype.numpy).reshape(shape)
            continue
        feed[spec.name] = np.frombuffer(data, dtype=dtype.numpy, count=count).reshape(shape)
    missing = [n for n in by_name if n not in feed]
    if missing:
        raise bad(f"missing inputs {missing} of model {request.model_name!r}")
    return feed


def _bytes_input(tensor: Any, raw: bytes | None, count: int, read: SharedRead) -> np.ndarray:
    """A BYTES input from its region slice, its raw contents or ``bytes_contents``."""
    what = f"input {tensor.name!r}"
    region = shared_memory_params(tensor.parameters)
    if region is not None:
        return decode_bytes(read(*region), count, what)
    if raw is not None:
        return decode_bytes(raw, count, what)
    values = tensor.contents.bytes_contents
    if len(values) != count:
        raise bad(f"{what}: {len(values)} values in bytes_contents for {count} elements")
    joined = b"".join(len(v).to_bytes(4, "little") + v for v in values)
    return decode_bytes(joined, count, what)


def requested_outputs(
    request: pb.ModelInferRequest, specs: Sequence[TensorSpec]
) -> list[tuple[TensorSpec, tuple[str, int, int] | None]]:
    """The outputs to send back (every output when none is named), each with its
    shared-memory slice if it asks for one."""
    by_name = {s.name: s for s in specs}
    if not request.outputs:
        return [(s, None) for s in specs]
    chosen = []
    for wanted in request.outputs:
        spec = by_name.get(wanted.name)
        if spec is None:
            raise bad(
                f"model {request.model_name!r} has no output {wanted.name!r}; its outputs: "
                f"{', '.join(by_name)}"
            )
        if "classification" in wanted.parameters:
            raise ServiceError(
                grpc.StatusCode.UNIMPLEMENTED,
                "the classification extension is not served; ask for the output itself",
            )
        if not is_json_form(spec):
            kserve_type(spec)
        chosen.append((spec, shared_memory_params(wanted.parameters)))
    return chosen


def bound_outputs(
    request: pb.ModelInferRequest,
    chosen: Sequence[tuple[TensorSpec, tuple[str, int, int] | None]],
    mapped: Callable[[str, int, int], np.ndarray | None],
) -> dict[str, np.ndarray]:
    """Arrays over the region slices that ``chosen`` outputs of static shape go to, where
    ``mapped`` gives one (a region the daemon maps): the model writes there, and
    :func:`encode_outputs` has nothing left to copy. Not a slice that overlaps an input's:
    the inputs are read where they lie, and a model writing over what it reads would read
    its own results."""
    if all(region is None for _, region in chosen):
        return {}  # the common case, outputs in the answer: nothing to look at
    inputs = [shared_memory_params(t.parameters) for t in request.inputs]
    read = [r for r in inputs if r is not None]
    bound = {}
    for spec, region in chosen:
        if region is None or spec.dtype is None or spec.kind != "tensor" or not spec.is_static:
            continue
        dtype = np.dtype(spec.dtype.numpy)
        if dtype.kind not in "biufc":
            continue
        shape = tuple(d for d in spec.shape or () if isinstance(d, int))
        nbytes = math.prod(shape) * dtype.itemsize
        name, offset, size = region
        if nbytes > size:
            continue  # encode_outputs names the error
        if any(n == name and o < offset + nbytes and offset < o + s for n, o, s in read):
            continue
        view = mapped(name, offset, nbytes)
        if view is not None:
            bound[spec.name] = view.view(dtype).reshape(shape)
    return bound


def encode_outputs(
    response: pb.ModelInferResponse,
    results: Mapping[str, Any],
    chosen: Sequence[tuple[TensorSpec, tuple[str, int, int] | None]],
    write: SharedWrite,
    written: Collection[str] = (),
    kept: dict[str, np.ndarray] | None = None,
) -> None:
    """Put the results in ``response``: raw contents, or into the named region slices (but
    those ``written`` there already: :func:`bound_outputs`). With ``kept``, a numeric output
    not going to a region is put there as its array instead, with empty raw contents (the
    HTTP front writes its JSON from the array: no copy of its bytes into the message and
    back out)."""
    for spec, region in chosen:
        value = results[spec.name]
        json_form = is_json_form(spec)
        array = json_elements(spec, value) if json_form else np.ascontiguousarray(value)
        datatype = "BYTES" if json_form else kserve_type(spec)
        out = response.outputs.add(name=spec.name, datatype=datatype)
        out.shape.extend(array.shape)
        payload = encode_bytes(array) if datatype == "BYTES" else None
        if region is None and kept is not None and payload is None:
            kept[spec.name] = array
            response.raw_output_contents.append(b"")
            continue
        if region is None:
            response.raw_output_contents.append(payload if payload is not None else array.tobytes())
            continue
        response.raw_output_contents.append(b"")  # keeps the raw contents in output order
        name, offset, size = region
        data = np.frombuffer(payload, np.uint8) if payload is not None else array.reshape(-1)
        nbytes = data.nbytes
        if nbytes > size:
            raise bad(
                f"output {spec.name!r} is {nbytes} bytes ({array.dtype} "
                f"{list(array.shape)}), more than shared_memory_byte_size {size}"
            )
        if spec.name not in written:
            write(name, offset, data.view(np.uint8))
        out.parameters["shared_memory_region"].string_param = name
        out.parameters["shared_memory_byte_size"].int64_param = nbytes
        if offset:
            out.parameters["shared_memory_offset"].int64_param = offset


def metadata_tensor(spec: TensorSpec) -> dict[str, Any]:
    """Name, KServe datatype and shape (-1 for a dynamic dimension) of a model tensor, as a
    request gets it (a sequence of maps: BYTES [-1], a map: BYTES [1])."""
    if is_json_form(spec):
        return {"name": spec.name, "datatype": "BYTES", "shape": [-1 if spec.kind != "map" else 1]}
    kserve = spec.dtype.kserve if spec.dtype is not None else None
    shape = [d if isinstance(d, int) else -1 for d in spec.shape or ()]
    return {"name": spec.name, "datatype": kserve or str(spec.dtype or spec.kind), "shape": shape}
