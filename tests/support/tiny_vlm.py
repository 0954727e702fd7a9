"""A tiny BLIP-2 (a small ViT, a one-layer Q-Former and a tiny OPT text model), its processor and a local
tokenizer with an ``<image>`` token, built on the fly for the image tests (no downloads).

BLIP-2, not LLaVA or PaliGemma: vLLM's CLIP/SigLIP-tower models import torchvision (vllm/model_executor/
models/vision.py), which vLLM's CPU build cannot use here (pyproject: vllm); BLIP-2's tower is vLLM's own and
its image processor has a Pillow form. vLLM puts an image's ``<image>`` tokens (one per query) before the
prompt; a BLIP-2 prompt takes one image. Random vision weights and a text model trained for a few seconds on
tiny_llama's lines, so greedy outputs are peaked; the image still moves them. Seeded: two builds give the same
files.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from conveyor.deploy.example_repo import write_model
from tests.support.tiny_llama import CHAT_TEMPLATE, LINES, SAMPLE_CONFIG

IMAGE_TOKEN = "<image>"
IMAGE_SIZE = 32  # the vision tower's input: small, so the tower is cheap
PATCH_SIZE = 8
IMAGE_TOKENS = 4  # the Q-Former's queries: the tokens one image takes in the prompt


def build(root: Path) -> Path:
    """Write the model, processor and tokenizer into root/model; fast when already there."""
    model_dir = root / "model"
    if not (model_dir / "config.json").exists():
        _build(model_dir)
    return model_dir


def _tokenizer() -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<unk>", "<s>", "</s>", "<pad>", IMAGE_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(LINES * 4, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
        extra_special_tokens={"image_token": IMAGE_TOKEN},
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _build(model_dir: Path) -> None:
    import torch
    from transformers import (
        Blip2Config,
        Blip2ForConditionalGeneration,
        Blip2Processor,
        Blip2QFormerConfig,
        Blip2VisionConfig,
        BlipImageProcessorPil,
        OPTConfig,
        OPTForCausalLM,
    )

    from tests.support.tiny_llama import _train

    torch.manual_seed(0)
    tokenizer = _tokenizer()
    text = OPTConfig(
        vocab_size=len(tokenizer),  # type: ignore[arg-type]
        hidden_size=128, ffn_dim=256, num_hidden_layers=2, num_attention_heads=2, word_embed_proj_dim=128,
        max_position_embeddings=256,
        bos_token_id=tokenizer.bos_token_id,  # type: ignore[attr-defined]
        eos_token_id=tokenizer.eos_token_id,  # type: ignore[attr-defined]
        pad_token_id=tokenizer.pad_token_id,  # type: ignore[attr-defined]
    )
    lm = OPTForCausalLM(text)
    _train(lm, tokenizer, LINES, steps=60)
    config = Blip2Config(
        vision_config=Blip2VisionConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
            image_size=IMAGE_SIZE, patch_size=PATCH_SIZE,
        ).to_dict(),
        qformer_config=Blip2QFormerConfig(
            hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=128,
            encoder_hidden_size=64,
        ).to_dict(),
        text_config=text.to_dict(),
        num_query_tokens=IMAGE_TOKENS,
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),  # type: ignore[attr-defined]
        torch_dtype="float32",
    )
    model = Blip2ForConditionalGeneration(config)
    model.language_model.load_state_dict(lm.state_dict())
    image_processor = BlipImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    processor = Blip2Processor(image_processor=image_processor, tokenizer=tokenizer, num_query_tokens=IMAGE_TOKENS)
    processor.save_pretrained(str(model_dir))
    tokenizer.save_pretrained(str(model_dir))  # type: ignore[attr-defined]
    model.save_pretrained(str(model_dir), safe_serialization=True)


def image_png(seed: int, size: int = IMAGE_SIZE) -> bytes:
    """A seeded random RGB image as PNG bytes."""
    import random

    from PIL import Image

    rng = random.Random(seed)
    img = Image.frombytes("RGB", (size, size), bytes(rng.randrange(256) for _ in range(size * size * 3)))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


# The engine's arguments, in model.json and in vLLM's own run alike.
_ENGINE: dict[str, object] = {
    "enforce_eager": True,
    "dtype": "float32",
    "max_model_len": 256,
    "max_num_seqs": 8,
    "kv_cache_memory_bytes": 64 << 20,  # on CPU the default reserves 92% of the memory
    "limit_mm_per_prompt": {"image": 1},  # BLIP-2 takes one image a prompt
}


def write_repository(repo: Path, model_dir: Path, name: str = "vlm_model", **engine: object) -> Path:
    """A Triton vLLM backend repository for the tiny VLM: the sample config.pbtxt, 1/model.json."""
    model_json = {"model": str(model_dir), **_ENGINE, **engine}
    return Path(write_model(repo, name, SAMPLE_CONFIG, {"model.json": json.dumps(model_json, indent=2)}))


# --- vLLM's own answers, for the tests that compare Conveyor with it (tests/workers/backends/vllm/test_vlm_e2e.py)

PROMPT = "the quick brown"
MAX_TOKENS = 8
IMAGE_SEEDS = (1, 2)  # two images, two answers: the image reaches the model


def data_url(seed: int) -> str:
    import base64

    return "data:image/png;base64," + base64.b64encode(image_png(seed)).decode()


def chat_messages(url: str) -> list[dict[str, object]]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": PROMPT}]}]


def reference(model_dir: Path) -> dict[str, str]:
    """vLLM's greedy answers, computed in a child process (this module run as a script, its engine gone with
    it): ``generate:<seed>``, PROMPT with image ``seed``; ``chat:<seed>``, ``LLM.chat`` of ``chat_messages``."""
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", __name__, str(model_dir)], capture_output=True, text=True,
                         timeout=600, check=True, env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    answers: dict[str, str] = json.loads(out.stdout.splitlines()[-1])
    return answers


def _vllm_answers(model_dir: str) -> dict[str, str]:
    from PIL import Image
    from vllm import LLM, SamplingParams

    llm = LLM(model=model_dir, **_ENGINE)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    out = {}
    for seed in IMAGE_SEEDS:
        image = Image.open(io.BytesIO(image_png(seed))).convert("RGB")
        (gen,) = llm.generate({"prompt": PROMPT, "multi_modal_data": {"image": image}}, params, use_tqdm=False)
        out[f"generate:{seed}"] = gen.outputs[0].text
        (chat,) = llm.chat(chat_messages(data_url(seed)), params, use_tqdm=False)
        out[f"chat:{seed}"] = chat.outputs[0].text
    return out


if __name__ == "__main__":
    import sys

    print(json.dumps(_vllm_answers(sys.argv[1])))
