"""The seed systems' own APIs over crossrt (the last layer: it may use every other).

- :mod:`crossrt.compat.bmlib`: BMLib-style device memory (``bm_handle_t``,
  ``bm_malloc_device_byte``, ``bm_memcpy_s2d``...) as :class:`~crossrt.compat.bmlib.Device`.
- :mod:`crossrt.compat.bmruntime`: Sophgo BMRuntime (``bm_*``, ``bmrt_*``, Context / Network).
- :mod:`crossrt.compat.neuron`: AWS Neuron Runtime (``nrt_*``, ``NRT_STATUS``, ``NEURON_RT_*``).
- :mod:`crossrt.compat.nnrt`: OpenHarmony NNRt (``OH_NNModel_*`` ... ``OH_NNDevice_*``).

docs/compat.md lists, per seed system, every function and the status mapping both ways.
"""
