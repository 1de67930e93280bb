"""Loading a causal LM and its tokenizer: one place for devices, dtypes and load errors.

Used by `gaca score` and `gaca train-offline`. A model is a local directory, a GGUF file (read
by transformers with the gguf package, dequantized) or a hub id;
`HF_HUB_OFFLINE=1` is honoured (transformers reads it), `trust_remote_code` stays off unless
asked for, and safetensors weights are preferred when a checkpoint has both formats. Every
failure to load becomes a `GacaError` (exit status 1, one line), never a traceback.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import warnings
from collections.abc import Iterator
from typing import Any

from gaca_cli.errors import GacaError

DTYPES = ("auto", "bf16", "fp16", "fp32")
_DEVICE_RE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


@contextlib.contextmanager
def peft_quiet() -> Iterator[None]:
    """peft asks transformers 5 a deprecated question (`is_gradient_checkpointing`) when it
    wraps a model: the warning is not the user's to act on, so it is not shown."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
        yield


def check_device_name(device: str) -> str:
    """Validate the spelling of `--device` (for config `__post_init__`); raises ValueError."""
    if not _DEVICE_RE.match(device):
        raise ValueError(f"device must be auto, cpu, cuda, cuda:N or mps, got {device!r}")
    return device


def check_dtype_name(dtype: str) -> str:
    """Validate the spelling of `--dtype` (for config `__post_init__`); raises ValueError."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return dtype


def resolve_device(device: str = "auto"):
    """`auto` -> cuda, else mps, else cpu. Under torchrun / accelerate (LOCAL_RANK set), `auto`
    and `cuda` mean the local rank's GPU."""
    import torch

    check_device_name(device)
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    dev = torch.device(device)
    if device == "cuda" and "LOCAL_RANK" in os.environ and torch.cuda.is_available():
        dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())  # one GPU per rank
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise GacaError(f"--device {device}: no CUDA device is available here; use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise GacaError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) here")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise GacaError(f"--device {device}: MPS is not available here; use --device cpu")
    return dev


def resolve_dtype(dtype: str, device) -> Any:
    """`auto` -> bfloat16 on CUDA, float32 elsewhere."""
    import torch

    check_dtype_name(dtype)
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]


def dtype_name(dtype) -> str:
    """torch dtype -> bf16 | fp16 | fp32 (for metadata and summaries)."""
    text = str(dtype).removeprefix("torch.")
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(text, text)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _where(model: str) -> str:
    if os.path.exists(model):
        return "directory"
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return "offline"
    return "hub"


def _config_errors() -> tuple[type[Exception], ...]:
    """What huggingface_hub raises for a config.json that its model class rejects (e.g. a
    hidden size that is not a multiple of the heads); older versions raise ValueError."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:
        return ()
    return (StrictDataclassError,)


def _load_errors(*more: type[Exception]) -> tuple[type[Exception], ...]:
    """The exceptions that mean "this model or tokenizer cannot be loaded" (not a bug in gaca)."""
    return (OSError, ValueError, KeyError, TypeError, ImportError, AttributeError, *more, *_config_errors())


def _load_error(model: str, what: str, exc: BaseException) -> GacaError:
    where = _where(model)
    hint = ""
    if where == "offline":
        hint = " (HF_HUB_OFFLINE is set: only local directories and cached hub models can be used)"
    reason = _first_line(exc)
    if isinstance(exc, _config_errors()):
        what = "config (config.json)"
        if exc.__cause__ is not None:  # the validator's own message
            reason = _first_line(exc.__cause__)
    return GacaError(f"cannot load the {what} ({reason}){hint}", file=model)


def _looks_like_path(model: str) -> bool:
    """Hub ids are `name` or `namespace/name`; anything else is meant as a local path."""
    return model.startswith((".", "/", "~")) or model.count("/") >= 2 or (os.sep != "/" and os.sep in model)


def is_adapter(model: str) -> bool:
    """A local directory holding a LoRA adapter (what `gaca train-offline --lora-r` writes)
    rather than a whole model: adapter_config.json and no config.json."""
    return (
        os.path.isdir(model)
        and not os.path.exists(os.path.join(model, "config.json"))
        and os.path.exists(os.path.join(model, "adapter_config.json"))
    )


def _check_local(model: str) -> None:
    if os.path.isdir(model):
        if not os.path.exists(os.path.join(model, "config.json")) and not is_adapter(model):
            raise GacaError(
                "the directory has no config.json (not a transformers model) and no adapter_config.json "
                "(not a LoRA adapter)",
                file=model,
            )
        return
    if os.path.exists(model) and model.lower().endswith(".gguf"):
        from transformers.utils import is_gguf_available

        if not is_gguf_available():
            raise GacaError("a GGUF model file needs the gguf package (>= 0.10): pip install gguf", file=model)
    elif os.path.exists(model):
        raise GacaError("a model must be a directory, a GGUF file or a hub id, not a file of another kind", file=model)
    elif _looks_like_path(model):
        raise GacaError(f"no such model {'file' if model.lower().endswith('.gguf') else 'directory'}", file=model)


def _source(model: str) -> tuple[str, dict[str, Any]]:
    """(what from_pretrained reads, its extra arguments): a GGUF file is read by name from its directory."""
    if os.path.isfile(model):
        return os.path.dirname(os.path.abspath(model)), {"gguf_file": os.path.basename(model)}
    return model, {}


def quiet_transformers() -> None:
    """Keep transformers' own progress bars and advice off our stderr."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def load_tokenizer(model: str, revision: str | None = None, trust_remote_code: bool = False):
    """The model's tokenizer (a fast one when available); GacaError when there is none."""
    from transformers import AutoTokenizer

    _check_local(model)
    quiet_transformers()
    try:
        source, gguf = _source(model)
        return AutoTokenizer.from_pretrained(source, revision=revision, trust_remote_code=trust_remote_code, **gguf)
    except _load_errors() as exc:
        raise _load_error(model, "tokenizer", exc) from None


def load_causal_lm(
    model: str,
    revision: str | None = None,
    dtype: str = "auto",
    device: str = "auto",
    trust_remote_code: bool = False,
):
    """Load `model` (a local directory or hub id) as a causal LM, in eval mode, on a device.

    Returns (model, tokenizer, device: torch.device, dtype: torch.dtype). Raises GacaError when
    the model or tokenizer cannot be loaded, is not a causal LM, or the device is missing.
    """
    import torch  # noqa: F401  (fail early and clearly if torch is broken)
    import transformers
    from transformers import AutoModelForCausalLM

    quiet_transformers()
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    model = str(model)
    tokenizer = load_tokenizer(model, revision, trust_remote_code)
    from safetensors import SafetensorError

    try:
        if is_adapter(model):
            # a LoRA adapter: its base model (adapter_config.json names it) with the adapter merged
            # into the weights, so that scoring and training see one plain model
            from peft import AutoPeftModelForCausalLM

            with peft_quiet():
                peft_model = AutoPeftModelForCausalLM.from_pretrained(
                    model, dtype=torch_dtype, trust_remote_code=trust_remote_code
                )
                lm = peft_model.merge_and_unload()
            lm.requires_grad_(True)  # peft froze the base weights; a loaded model trains them all
        else:
            source, gguf = _source(model)
            if gguf and hasattr(transformers, "GgufConfig"):  # transformers 5: dense, so that it trains and saves
                gguf["quantization_config"] = transformers.GgufConfig(dequantize=True)
            # transformers draws its own tqdm bar while it dequantizes a GGUF file: not on our stderr
            with contextlib.redirect_stderr(io.StringIO()) if gguf else contextlib.nullcontext():
                loaded: Any = AutoModelForCausalLM.from_pretrained(
                    source,
                    **gguf,
                    revision=revision,
                    dtype=torch_dtype,
                    trust_remote_code=trust_remote_code,
                    use_safetensors=None,  # prefer safetensors, accept .bin where that is all there is
                    output_loading_info=True,  # (model, what was missing, unexpected, mismatched)
                )
            lm, info = loaded
            _check_loaded(info, model)
    except _load_errors(RuntimeError) as exc:
        raise _load_error(model, "model", exc) from None
    except SafetensorError as exc:  # a truncated or garbled model.safetensors
        raise _load_error(model, "model weights", exc) from None
    if lm.get_output_embeddings() is None:
        raise GacaError("the model has no language-model head (not a causal LM)", file=model)
    if getattr(lm.config, "is_encoder_decoder", False):
        raise GacaError("the model is an encoder-decoder, not a causal decoder", file=model)
    try:
        lm = lm.to(dev)
    except (RuntimeError, torch.OutOfMemoryError) as exc:
        raise GacaError(f"cannot move the model to {dev} ({_first_line(exc)})", file=model) from None
    lm.eval()
    check_causal(lm, model)
    return lm, tokenizer, dev, torch_dtype


_REBUILT_BUFFER = re.compile(r"(\.attn\.(masked_)?bias|rotary_emb\.inv_freq)$")


def _check_loaded(info: dict, model: str) -> None:
    """Refuse a model whose weight files lack tensors its config asks for, or hold them in
    another shape: transformers would initialise those at random, and every number after would
    change from run to run. Weights the config does not use are only a warning."""

    def some(keys: list) -> str:
        names = [k if isinstance(k, str) else str(k[0]) for k in keys]
        return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")

    if info.get("missing_keys"):
        missing = sorted(info["missing_keys"])
        raise GacaError(
            f"the weight files lack {len(missing)} tensor(s) the config asks for ({some(missing)}); they would be "
            "random: check that config.json and the weights belong together",
            file=model,
        )
    if info.get("mismatched_keys"):
        mismatched = sorted(info["mismatched_keys"])
        raise GacaError(
            f"{len(mismatched)} tensor(s) of the weight files have another shape than the config asks for "
            f"({some(mismatched)}); check that config.json and the weights belong together",
            file=model,
        )
    # buffers older checkpoints saved and models now rebuild (GPT-2's causal masks, rotary
    # frequencies): not weights the config leaves unused
    unexpected = sorted(k for k in info.get("unexpected_keys") or () if not _REBUILT_BUFFER.search(str(k)))
    if unexpected:
        warnings.warn(
            f"{model}: the weight files hold {len(unexpected)} tensor(s) the config does not use ({some(unexpected)})",
            stacklevel=2,
        )


def check_causal(lm, model: str) -> None:
    """Refuse a model whose predictions can see later tokens (bidirectional attention, e.g. a
    masked LM such as BERT loaded through a causal-LM head): its NLLs would be meaningless.

    Two 8-token sequences that differ only in their last token go through the model one at a
    time (the same shapes, so the same kernels): a causal decoder gives the same logits at
    every earlier position, bit for bit, while the last position's logits change. A model
    whose earlier logits move by more than 1e-4 of the last position's change is refused
    (a randomly initialised BERT moves them by ~2e-3 of it, a trained one by far more)."""
    import torch

    vocab = int(lm.get_output_embeddings().weight.shape[0])
    first = torch.arange(8, dtype=torch.long) % vocab
    second = first.clone()
    second[-1] = (first[-1] + 1) % vocab
    device = next(lm.parameters()).device
    with torch.no_grad():
        a, b = (lm(input_ids=ids[None].to(device)).logits[0].float() for ids in (first, second))
    earlier = float((a[:-1] - b[:-1]).abs().max())
    last = float((a[-1] - b[-1]).abs().max())
    if earlier > 1e-4 * last:
        raise GacaError(
            "the model is not a causal language model: its prediction at a position changes when a later token "
            "changes (bidirectional attention, e.g. a masked LM such as BERT); use a decoder-only causal LM",
            file=model,
        )


#: files of a model directory whose content the numbers depend on
_MODEL_FILES = (".safetensors", ".bin", ".pt", ".pth", ".json", ".model", ".txt", ".tiktoken", ".jinja")
_SAMPLES = 16  # chunks read per file
_CHUNK = 1 << 16  # bytes per chunk


def model_key(model: str) -> str:
    """`--model` as `--resume` compares it: a local directory or GGUF file by its resolved path (so
    that `./llama`, `llama` and `/abs/llama` are one model), a hub id as it is."""
    return os.path.realpath(model) if os.path.exists(model) else model


def model_fingerprint(model: str, revision: str | None = None) -> str:
    """A cheap content fingerprint of a model, for `--resume` to refuse a model that changed.

    For a local directory: every weights, config and tokenizer file's name and size, and the
    sha256 of 16 chunks of 64 KiB spread evenly over its bytes (whole files when smaller; about
    1 MiB read per file, whatever its size). New weights at the same path (a retrained model of
    the same shapes) change the sampled bytes; a resumed run of a 100 GB model stays instant.
    Only the directory's own files count, as transformers loads only those: a run that writes
    its output or checkpoints into a folder inside the model directory can still be resumed.
    For a GGUF file: the same, of that one file. For a hub id: the id and revision (a cached
    hub snapshot is immutable per commit)."""
    if not os.path.exists(model):
        return hashlib.sha256(f"hub:{model}@{revision or 'main'}".encode()).hexdigest()[:16]
    h = hashlib.sha256()
    paths = [model]
    if os.path.isdir(model):  # its model files
        paths = [os.path.join(model, n) for n in sorted(os.listdir(model)) if n.endswith(_MODEL_FILES)]
        paths = [p for p in paths if os.path.isfile(p)]
    for path in paths:
        name = os.path.basename(path)
        size = os.path.getsize(path)
        h.update(f"{name}\0{size}\0".encode())
        with open(path, "rb") as f:
            if size <= _SAMPLES * _CHUNK:
                h.update(f.read())
                continue
            step = (size - _CHUNK) // (_SAMPLES - 1)
            for k in range(_SAMPLES):
                f.seek(k * step)
                h.update(f.read(_CHUNK))
    return h.hexdigest()[:16]


def position_limit(model) -> int | None:
    """The longest sequence `model` can take when its positions are learned embeddings
    (GPT-2, OPT: a longer one fails inside the forward), else None. Rotary models have no such
    limit; their `max_position_embeddings` is the length they were trained to, not a bound."""
    config = getattr(model, "config", None)
    if config is None or any(getattr(config, a, None) for a in ("rope_parameters", "rope_scaling", "rope_theta")):
        return None
    limit = getattr(config, "max_position_embeddings", None)
    return limit if isinstance(limit, int) and limit > 0 else None
