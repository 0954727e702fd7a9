"""The stand-in for the models vllm_backend's CI downloads (tests/support/tiny_llama.py's ``build_standin``,
deploy/vllm_backend_ci.sh): its greedy text passes the suites' "output is a sentence" checks (more than
four spaces in the default 16 tokens), never ends early (their finish reason "length", the cancellation
test's long generation), and every token's log-probability is below zero (their cumulative log-probability
moves at each token); the offline Hugging Face cache serves it under the downloaded model's name."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import tiny_llama

LEVEL = "slow"

pytest.importorskip("transformers")

pytestmark = pytest.mark.timeout(300)  # the build: some 100 Adam steps on a busy 2-core host

# The prompts of vllm_backend's CI (L0_check_health_vllm, L0_additional_outputs_vllm, request_cancellation).
PROMPTS = ["In this example,", "The capital of France is", "Write an original and creative poem of at least 200 words."]
DEFAULT_MAX_TOKENS = 16  # vLLM's, which the suites' requests keep


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama.build_standin(tmp_path_factory.getbasetemp() / "standin")


def test_greedy_text_reads_as_words_and_goes_on(standin: Path) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(standin))
    model = LlamaForCausalLM.from_pretrained(str(standin))
    assert tokenizer.tokenize(" the capital of the country") == ["Ġthe", "Ġcapital", "Ġof", "Ġthe", "Ġcountry"]
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=DEFAULT_MAX_TOKENS, do_sample=False, output_scores=True,
                                 return_dict_in_generate=True, pad_token_id=tokenizer.eos_token_id)
        new = out.sequences[0, ids.shape[1]:].tolist()
        assert len(new) == DEFAULT_MAX_TOKENS and tokenizer.eos_token_id not in new, prompt
        assert tokenizer.decode(new).count(" ") > 4, (prompt, tokenizer.decode(new))
        chosen = [float(torch.log_softmax(s[0].float(), -1)[t]) for s, t in zip(out.scores, new, strict=True)]
        assert all(lp < 0 for lp in chosen), chosen


def test_the_offline_cache_serves_it_as_the_downloaded_model(standin: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import snapshot_download

    snapshot = tiny_llama.standin_cache(tmp_path / "hf", "facebook/opt-125m", standin)
    found = snapshot_download("facebook/opt-125m", cache_dir=str(tmp_path / "hf" / "hub"), local_files_only=True)
    assert Path(found) == snapshot and (Path(found) / "config.json").is_file()
