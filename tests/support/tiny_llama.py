"""A tiny Llama, its tokenizer and two LoRA adapters, built on the fly for the vLLM tests (no downloads).

The model is trained for a few seconds on the lines below so its greedy outputs are peaked (a random
model's logits are nearly flat, and a batched and an unbatched run could then pick different tokens on
rounding). Head size 64: vLLM's CPU attention needs at least 32. Everything is seeded: two builds give
the same files.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from conveyor.deploy.example_repo import write_model

# Set by ``make test``, which installs the vllm extra: there a missing engine is a failure, not a skip.
REQUIRE_VLLM_ENV = "CONVEYOR_REQUIRE_VLLM"


def require_vllm() -> None:
    """Skip the calling test module where vLLM is not installed, unless ``make test`` requires it."""
    if os.environ.get(REQUIRE_VLLM_ENV) == "1":
        import vllm  # noqa: F401  (an ImportError here fails the module: the install is broken)
    else:
        import pytest

        pytest.importorskip("vllm")


LINES = [
    "the quick brown fox jumps over the lazy dog",
    "a conveyor carries requests from the router to the workers",
    "triton serves models over http and grpc",
    "tokens stream out one by one until the end",
    "the engine batches every request in flight",
    "shared memory holds the tensors between processes",
    "hello world, this is a tiny language model",
    "every adapter changes what the model says",
]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)
ADAPTERS = ("alpha", "beta")
# Triton's samples/model_repository/vllm_model/config.pbtxt: inputs, outputs and decoupled come from the backend.
SAMPLE_CONFIG = 'backend: "vllm"\n\ninstance_group [\n  {\n    count: 1\n    kind: KIND_MODEL\n  }\n]\n'
# The engine's vllm: metrics on /metrics: the backend reports them only when the config asks.
REPORT_METRICS = 'parameters { key: "REPORT_CUSTOM_METRICS" value { string_value: "true" } }\n'


@dataclass(frozen=True)
class TinyLlama:
    model_dir: Path  # a Hugging Face model folder (config, safetensors, tokenizer)
    adapters: dict[str, Path]  # LoRA adapter name -> its peft folder


def build(root: Path) -> TinyLlama:
    """Write the model into root/model and the adapters into root/lora/<name>; fast when already there."""
    model_dir = root / "model"
    adapters = {name: root / "lora" / name for name in ADAPTERS}
    if not (model_dir / "config.json").exists():
        _build_model(model_dir)
    for seed, path in enumerate(adapters.values(), start=1):
        if not (path / "adapter_config.json").exists():
            _build_adapter(model_dir, path, seed)
    return TinyLlama(model_dir, adapters)


def _build_tokenizer(model_dir: Path) -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(LINES * 4, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="</s>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(model_dir))
    return fast


def _build_model(model_dir: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    tokenizer = _build_tokenizer(model_dir)
    vocab = len(tokenizer)  # type: ignore[arg-type]
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,  # head size 64
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=tokenizer.bos_token_id,  # type: ignore[attr-defined]
        eos_token_id=tokenizer.eos_token_id,  # type: ignore[attr-defined]
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    _train(model, tokenizer, LINES, steps=60)
    model.save_pretrained(str(model_dir), safe_serialization=True)


def _train(model: object, tokenizer: object, lines: list[str], steps: int, lr: float = 3e-3) -> None:
    """A few Adam steps on ``lines``: peaked logits, and outputs that look like the text."""
    import torch

    ids = [tokenizer(line)["input_ids"] for line in lines]  # type: ignore[operator]
    width = max(len(i) for i in ids)
    pad = tokenizer.eos_token_id  # type: ignore[attr-defined]
    batch = torch.tensor([i + [pad] * (width - len(i)) for i in ids])
    trained = [p for p in model.parameters() if p.requires_grad]  # type: ignore[attr-defined]
    opt = torch.optim.Adam(trained, lr=lr)
    model.train()  # type: ignore[attr-defined]
    for _ in range(steps):
        loss = model(input_ids=batch, labels=batch).loss  # type: ignore[operator]
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()  # type: ignore[attr-defined]


def _build_adapter(model_dir: Path, path: Path, seed: int) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoTokenizer, LlamaForCausalLM

    torch.manual_seed(seed)
    base = LlamaForCausalLM.from_pretrained(str(model_dir))
    # init_lora_weights=False: random A and B, so the adapter changes the output (the default B is zero);
    # then a few steps on the lines with their tails reordered, so its outputs (after the first two words
    # of a line: the tests' prompts) are peaked too.
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = get_peft_model(base, config)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    lines = [" ".join(_shuffled(line.split(), seed)) for line in LINES]
    _train(model, tokenizer, lines, steps=60, lr=1e-2)
    model.save_pretrained(str(path))


def _shuffled(words: list[str], seed: int) -> list[str]:
    head, tail = words[:2], words[2:]
    return head + (tail[::-1] if seed == 1 else tail[1:] + tail[:1])


def prompts(tiny: TinyLlama, tokens: int, seed: int) -> Callable[[], str]:
    """A maker of random prompts of exactly ``tokens`` tokens (BOS included) as an engine tokenizes them,
    of the training text's words: whole blocks, for tests of what an engine's prefix cache holds."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny.model_dir))
    words = " ".join(LINES).replace(",", "").split()
    rng = random.Random(seed)

    def one() -> str:
        text = rng.choice(words)
        while len(tokenizer(text)["input_ids"]) < tokens:
            text += " " + rng.choice(words)
        return text if len(tokenizer(text)["input_ids"]) == tokens else one()

    return one


def write_repository(repo: Path, tiny: TinyLlama, name: str = "vllm_model", **engine: object) -> Path:
    """A Triton vLLM backend repository: the sample config.pbtxt as is, 1/model.json, 1/multi_lora.json."""
    model_json = {
        "model": str(tiny.model_dir),
        "enforce_eager": True,
        "dtype": "float32",
        "max_model_len": 256,
        "enable_lora": True,
        "max_loras": 2,
        "max_lora_rank": 8,
        "max_num_seqs": 32,
        "kv_cache_memory_bytes": 64 << 20,  # on CPU the default reserves 92% of the memory
        **engine,
    }
    return Path(write_model(repo, name, SAMPLE_CONFIG, {
        "model.json": json.dumps(model_json, indent=2),
        "multi_lora.json": json.dumps({k: str(v) for k, v in tiny.adapters.items()}, indent=2),
    }))


# --- the stand-in for a downloaded model (vllm_backend's CI: deploy/vllm_backend_ci.sh) ---------------------

# Plain sentences: the stand-in's greedy text reads as words, each token one word with its leading space.
STANDIN_TEXT = """\
the capital of the country is a large city with many old streets and a river that runs through it .
in this example , the model writes one word after another until it has written enough words .
the future of the city depends on the people who live there and on the work they do every day .
the most dangerous animal is the one that nobody sees coming , and the safest is the one you know .
a small model can still write a long story when it has learned the words that follow each other .
every morning the old man walks to the market , buys bread and fruit , and talks with his friends .
the river is quiet in the evening , and the birds fly over the water before the sun goes down .
she opened the book , read the first page , and decided that she would finish it before the night .
we write tests so that the server answers every request the same way , today and tomorrow .
the train leaves the station at noon and arrives in the next town an hour later than planned .
"""
STANDIN_CONTEXT = 2048  # vllm_backend's request_cancellation asks for 1500 tokens after its prompt
STANDIN_CHUNK = 64  # training windows of the running text, in tokens
STANDIN_STEPS = 100
# The largest gap between the first and the second logit of a step, after scaling: greedy is as
# stable as before, and every token's log-probability stays below zero in float32 (a checks that a
# cumulative log-probability moves at each token).
STANDIN_MAX_GAP = 8.0
STANDIN_REVISION = "0" * 40  # the cache's snapshot name (a commit hash's form)


def build_standin(model_dir: Path) -> Path:
    """A tiny Llama and its tokenizer in ``model_dir`` that write plausible text: a word-level vocabulary
    (byte-level BPE trained to whole words, each word token carrying its leading space), trained on the
    lines above as one running text (greedy output goes on from line to line and never ends early: no
    end-of-sequence token is ever a label), with a 2048-token context. Seeded: two builds give the same
    files; fast when already there."""
    if (model_dir / "config.json").exists():
        return model_dir
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    lines = STANDIN_TEXT.splitlines()
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([" " + line for line in lines] * 8, trainer)  # every word with its space
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                        pad_token="</s>")
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(str(model_dir))
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=STANDIN_CONTEXT,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    running = tokenizer(" ".join(lines * 2), add_special_tokens=False)["input_ids"]
    windows = [running[i:i + STANDIN_CHUNK] for i in range(0, len(running) - STANDIN_CHUNK, STANDIN_CHUNK // 2)]
    bos = tokenizer.bos_token_id
    batch = torch.tensor([[bos, *w] for w in windows])
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(STANDIN_STEPS):
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        top = model(input_ids=batch).logits.topk(2, dim=-1).values
        gap = float((top[..., 0] - top[..., 1]).max())
        if gap > STANDIN_MAX_GAP:
            model.lm_head.weight.mul_(STANDIN_MAX_GAP / gap)
    model.save_pretrained(str(model_dir), safe_serialization=True)
    return model_dir


def standin_cache(hf_home: Path, repo_id: str, model_dir: Path) -> Path:
    """``model_dir`` as the Hugging Face cache under ``hf_home`` holds ``repo_id`` (offline: HF_HUB_OFFLINE=1,
    HF_HOME=hf_home), so a config that names ``repo_id`` loads the stand-in without a download."""
    cached = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    snapshot = cached / "snapshots" / STANDIN_REVISION
    snapshot.mkdir(parents=True, exist_ok=True)
    for f in model_dir.iterdir():
        target = snapshot / f.name
        if not target.exists():
            target.symlink_to(f.resolve())
    (cached / "refs").mkdir(exist_ok=True)
    (cached / "refs" / "main").write_text(STANDIN_REVISION)
    return snapshot
