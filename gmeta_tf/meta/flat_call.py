"""Calling the traced step without ``tf.function``'s per-call argument handling.

A ``tf.function`` call with the batch (a dict of 22 tensors, 44 with the prefetching step's next
batch) spends about 1.1 ms before the graph runs: it builds a ``TraceType`` for every argument to
find the concrete function in its cache, then binds and flattens the arguments again. Its graph
run is what the step is, and on this box (2 cores, quickstart shapes, a ~9 ms step) that
millisecond was about a tenth of the step and most of what separated it from the same step
written in JAX (docs/profile.md). The concrete function itself takes flat tensors in ~0.1 ms.

``FlatCall`` keeps what TF's own call ends in (``tracing_compilation.call_function``: the concrete
function's ``_call_flat`` on the flat inputs and its captures) and replaces the lookup before it by
a dict keyed on what selects a concrete function for these arguments: their nest structure (dict
keys) and each tensor's shape and dtype. The first call with a key goes through the
``tf.function`` itself (it traces, creates variables, and raises what it raises), then takes the
concrete function TF dispatched to and checks that ``tf.nest.flatten`` lists the arguments in the
order TF's own binding does (the same tensor objects, one for one). A key whose arguments are not
all tensors, or whose order differs, stays on the ``tf.function`` call. So the fast path runs
exactly the graph the ``tf.function`` call would, on exactly the inputs it would pass.

``_call_flat`` is a private method of TF 2.16's ``ConcreteFunction``; tests/test_flat_call.py pins
it and the binding's order, and without it every call takes the ``tf.function`` path.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

import tensorflow as tf


def _structure(obj: Any) -> Any:
    """The nest structure of ``obj`` as a hashable value (dict keys in ``tf.nest``'s sorted order,
    sequence lengths), leaves as ``None``."""
    if isinstance(obj, dict):
        return tuple((k, _structure(obj[k])) for k in sorted(obj))
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, tuple(_structure(v) for v in obj))
    return None


class FlatCall:
    """``fn(*args)`` for a ``tf.function`` ``fn`` of tensor arguments, through its concrete
    function's flat call once the arguments' structure, shapes and dtypes have been seen."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self._concrete: Dict[Tuple, Optional[Any]] = {}  # key -> concrete function, None: use ``fn``

    def __call__(self, *args):
        flat = tf.nest.flatten(args)
        if not all(isinstance(t, tf.Tensor) for t in flat):
            return self.fn(*args)
        key = (_structure(args), tuple((tuple(t.shape), t.dtype) for t in flat))
        concrete = self._concrete.get(key, False)
        if concrete is False:
            out = self.fn(*args)
            self._concrete[key] = self._flat_callable(args, flat)
            return out
        if concrete is None:
            return self.fn(*args)
        return concrete._call_flat(flat, captured_inputs=concrete.captured_inputs)  # noqa: SLF001

    def _flat_callable(self, args: tuple, flat: list) -> Optional[Any]:
        """The concrete function ``fn`` runs for ``args``, if TF's binding passes it ``flat``."""
        concrete = self.fn.get_concrete_function(*args)
        if not hasattr(concrete, "_call_flat"):
            return None
        bound = concrete.function_type.unpack_inputs(concrete.function_type.bind(*args))
        if len(bound) != len(flat) or any(a is not b for a, b in zip(bound, flat)):
            return None
        return concrete

    def __getattr__(self, name: str):
        """Everything else is the ``tf.function``'s (``get_concrete_function``, ``_autograph``)."""
        if name == "fn":  # not set yet (unpickling, copying): no recursion through ``self.fn``
            raise AttributeError(name)
        return getattr(self.fn, name)

    @property
    def fast_keys(self) -> int:
        """How many argument signatures take the flat call (tests)."""
        return sum(c is not None for c in self._concrete.values())
