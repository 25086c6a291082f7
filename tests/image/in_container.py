"""Run inside the image by tests/image/test_image.py (mounted read-only at /tests): it reports
facts only the container can see, as JSON on stdout, for the host to assert on.

``python in_container.py facts COMMAND...``: who the process runs as, where each named command
resolves, which compilers exist, the installed distributions, and every library that a shared
object of the venv needs and that neither the image nor the venv has.

``python in_container.py score EXPORT_DIR OUT_JSON``: a ``predict`` request built from the
export's own signature (its TensorSpecs), and the scores the SavedModel itself computes for it
with stock TensorFlow -- what ``gmeta serve`` must answer over HTTP.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

VENV = Path(sys.prefix)


def facts(commands):
    from importlib import metadata

    # ldd also reports libraries that the venv itself ships and that the importing module loads
    # first (numpy.libs/*, TensorFlow's own for Horovod and TFRA); a library found nowhere in the
    # venv must come from the runtime image's system packages, and is missing there.
    libraries = sorted(p for p in VENV.rglob("*.so*") if p.is_file() and ".so" in p.name)
    shipped = {p.name for p in libraries}
    missing = {}
    for so in libraries:
        out = subprocess.run(["ldd", str(so)], capture_output=True, text=True).stdout
        lost = sorted({line.split()[0] for line in out.splitlines() if "not found" in line} - shipped)
        if lost:
            missing[str(so.relative_to(VENV))] = lost
    return {
        "uid": os.getuid(), "gid": os.getgid(), "home": os.path.expanduser("~"), "cwd": os.getcwd(),
        "which": {c: shutil.which(c) for c in commands},
        "compilers": {c: shutil.which(c) for c in ("cc", "gcc", "g++", "c++", "make", "cmake", "ld")},
        "distributions": sorted(f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions()),
        "console_scripts": sorted(e.name for e in metadata.entry_points(group="console_scripts")),
        "unresolved_libraries": missing,
        "python": sys.version.split()[0],
    }


def score(export_dir, out):
    import numpy as np
    import tensorflow as tf

    fn = tf.saved_model.load(export_dir).signatures["predict"]
    rng = np.random.default_rng(0)
    rows = 5
    inputs = {}
    for name, spec in fn.structured_input_signature[1].items():
        shape = [rows] + [d if d is not None else 3 for d in spec.shape.as_list()[1:]]
        if spec.dtype.is_integer:
            inputs[name] = rng.integers(0, 40, size=shape).astype(spec.dtype.as_numpy_dtype)
        else:
            inputs[name] = rng.normal(size=shape).astype(spec.dtype.as_numpy_dtype)
    scores = fn(**{k: tf.constant(v) for k, v in inputs.items()})["score"].numpy()
    # the columnar format (TF Serving's "inputs"), which every signature accepts (docs/serving.md)
    request = {"signature_name": "predict", "inputs": {k: v.tolist() for k, v in inputs.items()}}
    Path(out).write_text(json.dumps({"request": request, "scores": scores.tolist()}))
    return {"rows": rows, "inputs": sorted(inputs)}


if __name__ == "__main__":
    if sys.argv[1] == "facts":
        print(json.dumps(facts(sys.argv[2:])))
    elif sys.argv[1] == "score":
        print(json.dumps(score(sys.argv[2], sys.argv[3])))
    else:
        sys.exit(f"unknown command {sys.argv[1]!r}: facts | score")
