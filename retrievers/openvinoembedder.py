"""The int8 OpenVINO backend of the embedder: the same sentence-transformers model, exported
from its local weights and quantised once, then run without torch.

sentence-transformers' own ONNX and OpenVINO backends go through ``optimum``, which does not
import with transformers 5; so the model is exported here with ``torch.onnx`` (the whole
pipeline: transformer, pooling, normalisation), read by OpenVINO and quantised to int8 by
NNCF's post-training quantisation (weights and activations; the activations' ranges are
calibrated on English prose that ships with Python: its own documentation). Embeddings stay
within noise of the fp32 model's (cosine ≈ 0.995; SciFact nDCG@10 in the README) at about a
third of its CPU time. ONNX Runtime's dynamic int8 quantisation was measured too: 1.6× fp32
at best, where this is 3× (bench/RESULTS.md).

The export runs at set-up (``python -m ragchains.retrievers.openvinoembedder``) or on first
use, and is kept in the model cache, keyed by the weights it came from: nothing is
downloaded. Inference runs at fp32 precision around the int8 layers on every CPU, so one
index's vectors do not depend on the machine that embedded them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

# Bumped when the exported graph or its quantisation changes: old exports are not reused.
EXPORT_VERSION = 1
MODEL_FILE = "model-int8.xml"  # and its weights, model-int8.bin
META_FILE = "meta.json"
TOKENIZER_FILE = "tokenizer.json"


def model_cache_root() -> Path:
    """Where exported models are kept: ``RAGCHAINS_MODEL_CACHE``, else the user's cache."""
    configured = os.environ.get("RAGCHAINS_MODEL_CACHE")
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "ragchains" / "models"


def _weights_key(model_path: Path) -> str:
    """A key for the weights in ``model_path``: each file's name, size and modification time
    (hashing 90 MB of weights on every start would cost more than it protects)."""
    digest = hashlib.sha256(f"v{EXPORT_VERSION}\x00{model_path.resolve()}".encode())
    for file in sorted(p for p in model_path.rglob("*") if p.is_file()):
        stat = file.stat()
        digest.update(
            f"\x00{file.relative_to(model_path)}\x00{stat.st_size}\x00{stat.st_mtime_ns}".encode()
        )
    return digest.hexdigest()[:16]


def export_dir(model_path: str | Path) -> Path:
    path = Path(model_path)
    return model_cache_root() / f"{path.name or 'model'}-openvino-int8-{_weights_key(path)}"


def ensure_exported(model_path: str | Path) -> Path:
    """The folder of ``model_path``'s int8 OpenVINO export, made now if it is not there yet.

    Written to a temporary folder and renamed into place: two processes exporting at once
    both succeed, and a half-written export is never read."""
    target = export_dir(model_path)
    if (target / META_FILE).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=target.parent, prefix=".export-"))
    try:
        _export(Path(model_path), work)
        try:
            os.rename(work, target)
        except OSError:  # another process got there first; its export is as good
            if not (target / META_FILE).exists():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)  # gone already once renamed
    return target


CALIBRATION_TEXTS = 96
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def calibration_texts(count: int = CALIBRATION_TEXTS) -> list[str]:
    """Paragraphs of English prose of many lengths, from Python's own documentation (it ships
    with every Python): the activations' ranges for int8 are measured on these."""
    from pydoc_data.topics import topics

    paragraphs = [
        " ".join(p.split())
        for text in topics.values()
        for p in text.split("\n\n")
        if len(p.split()) >= 8
    ]
    step = max(1, len(paragraphs) // count)
    return paragraphs[::step][:count]


def _without_telemetry() -> None:
    """Keep OpenVINO's and NNCF's usage telemetry out: both import ``openvino_telemetry``
    only if they can, and it reports to Google Analytics. A ragchains run makes no network
    call it was not configured to make (tested with networking disabled)."""
    if "openvino_telemetry" not in sys.modules:
        sys.modules["openvino_telemetry"] = None  # type: ignore[assignment]  # import fails


def _export(model_path: Path, out: Path) -> None:
    _without_telemetry()
    import openvino as ov
    import torch
    from sentence_transformers import SentenceTransformer

    # NNCF's usage telemetry is off in CI runs; a ragchains run is always offline.
    os.environ.setdefault("NNCF_CI", "1")
    import nncf

    log.info("exporting %s to int8 OpenVINO in %s (once)", model_path, out)
    # Eager attention: an exported scaled_dot_product_attention carries masking ops that
    # OpenVINO's transformer passes do not fuse.
    model = SentenceTransformer(
        str(model_path), device="cpu", model_kwargs={"attn_implementation": "eager"}
    ).eval()
    tokenizer = model.tokenizer.backend_tokenizer
    features = model.preprocess(["an example sentence", "two"])
    inputs: list[str] = [name for name in MODEL_INPUTS if name in features]
    max_seq_length = int(model.max_seq_length or 512)

    class Pipeline(torch.nn.Module):
        """The model's modules (transformer, pooling, normalisation) over plain tensors."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
            embedded = self.model(dict(zip(inputs, tensors, strict=True)))
            return embedded["sentence_embedding"]  # type: ignore[no-any-return]

    axes: dict[str, dict[int, str]] = {name: {0: "batch", 1: "tokens"} for name in inputs}
    axes["sentence_embedding"] = {0: "batch"}
    onnx_file = out / "model-fp32.onnx"
    with torch.no_grad():
        torch.onnx.export(
            Pipeline(),
            tuple(features[name] for name in inputs),
            str(onnx_file),
            input_names=inputs,
            output_names=["sentence_embedding"],
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )
    tokenizer_json = tokenizer.to_str()
    encoder = _Tokenizer(tokenizer_json, max_seq_length, inputs)
    texts = calibration_texts()
    batches = [encoder.arrays(texts[i : i + 8]) for i in range(0, len(texts), 8)]
    fp32 = ov.Core().read_model(str(onnx_file))
    quantised = nncf.quantize(
        fp32,
        nncf.Dataset(batches),
        model_type=nncf.ModelType.TRANSFORMER,
        subset_size=len(batches),
        fast_bias_correction=True,
    )
    ov.save_model(quantised, str(out / MODEL_FILE))
    onnx_file.unlink()
    (out / TOKENIZER_FILE).write_text(tokenizer_json, encoding="utf-8")
    meta = {
        "source": str(model_path),
        "inputs": inputs,
        "dimension": int(_dimension_getter(model)() or 0),
        "max_seq_length": max_seq_length,
        "export_version": EXPORT_VERSION,
    }
    (out / META_FILE).write_text(json.dumps(meta, indent=2), encoding="utf-8")


def _dimension_getter(model: Any) -> Any:
    # sentence-transformers 6 renamed the method; accept both.
    return getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension


class _Tokenizer:
    """The model's tokenizer, truncating at its sequence length and padding each batch."""

    def __init__(self, tokenizer_json: str, max_seq_length: int, inputs: list[str]) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_str(tokenizer_json)
        self.tokenizer.enable_truncation(max_seq_length)
        self.tokenizer.enable_padding()
        self.inputs = inputs

    def arrays(self, texts: list[str]) -> dict[str, np.ndarray]:
        encodings = self.tokenizer.encode_batch(texts)
        arrays = {
            "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
        }
        return {name: arrays[name] for name in self.inputs}


@dataclass
class OpenVinoInt8Model:
    """An exported model: an OpenVINO compiled model and its tokenizer (no torch at run time)."""

    folder: Path
    compiled: Any
    encoder: _Tokenizer
    tokenizer_json: str
    dimension: int
    max_seq_length: int

    @classmethod
    def load(cls, model_path: str | Path) -> OpenVinoInt8Model:
        _without_telemetry()
        import openvino as ov

        folder = ensure_exported(model_path)
        meta = json.loads((folder / META_FILE).read_text(encoding="utf-8"))
        compiled = ov.Core().compile_model(
            str(folder / MODEL_FILE),
            "CPU",
            # fp32 around the int8 layers everywhere (the default is bf16 where the CPU has it):
            # the same vectors on every machine.
            {"INFERENCE_PRECISION_HINT": "f32"},
        )
        tokenizer_json = (folder / TOKENIZER_FILE).read_text(encoding="utf-8")
        return cls(
            folder=folder,
            compiled=compiled,
            encoder=_Tokenizer(tokenizer_json, int(meta["max_seq_length"]), list(meta["inputs"])),
            tokenizer_json=tokenizer_json,
            dimension=int(meta["dimension"]),
            max_seq_length=int(meta["max_seq_length"]),
        )

    def encode(self, texts: list[str], batch_size: int) -> np.ndarray:
        """Unit vectors of ``texts``, float32, in their order. Batches are made of texts of
        similar length (as sentence-transformers does): padding is most of the cost else."""
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        # One request per call: the compiled model's own is not safe across threads.
        request = self.compiled.create_infer_request()
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            result = request.infer(self.encoder.arrays([texts[i] for i in rows]))
            out[rows] = next(iter(result.values()))
        return out


if __name__ == "__main__":  # set-up: export the default embedder now, not on first use
    from ragchains.retrievers.embeddings import resolve_model_path

    name = sys.argv[1] if len(sys.argv) > 1 else "all-MiniLM-L6-v2"
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(ensure_exported(resolve_model_path(name)))
