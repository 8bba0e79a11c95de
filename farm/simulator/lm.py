"""A tiny causal language model for CPU runs (the learning example, the tests): the model
behind the scripted worker when it runs with ``--model``, and the one the trainer recomputes
logprobs with.

It is a test double for the policy a GPU engine would serve, not an engine. What it
needs to be: a real ``transformers`` causal LM (``save_pretrained`` /
``from_pretrained`` checkpoints; TRL's ``GRPOTrainer`` trains it as is), over the test
tokenizer's vocabulary, with no positional limit, and cheap on prompts of 40K tokens
(a real CLI's system prompt and tool schemas) on two cores. So no attention:

- a causal convolution over the last ``window`` token embeddings (local context),
- the running mean of every embedding so far (``cumsum`` / count: global context, O(n),
  the same at any length), and
- the sine of the running *sum* of the embeddings: a phase that every token moves by
  O(1), however far back it is, so a token dropped, added or changed anywhere in a
  40K-token context changes every later prediction (a real LM is that sensitive: this
  is what makes a misaligned context show up in the train/rollout logprob check),

summed, through ``tanh``, into an LM head with a bias. Padding (``attention_mask`` 0)
embeds as zeros and is not counted, so a left-padded row computes what the unpadded
one does. Position ``j``'s hidden state sees tokens ``<= j`` and predicts token ``j+1``.

:func:`token_logprobs` is the one scoring function: the worker scores what it emits
with it (prompt + output in one pass), the trainer recomputes a Sample's trained tokens
with it, so both sides run the same code at the same positions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput, CausalLMOutput
from safetensors.torch import load_file, save_file

GREEDY_BELOW = 1e-5  # SGLang: a temperature this low means greedy decoding
WEIGHTS = "model.safetensors"


class TinyLMConfig(PretrainedConfig):
    model_type = "farm_tiny_lm"

    def __init__(self, vocab_size: int = 4106, hidden_size: int = 32, window: int = 8,
                 pad_token_id: int | None = None, eos_token_id: int | None = None, **kwargs) -> None:
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.window = window
        super().__init__(pad_token_id=pad_token_id, eos_token_id=eos_token_id, **kwargs)


class TinyLMBackbone(PreTrainedModel):
    """Token ids -> hidden states (``last_hidden_state``): causal conv + running mean + phase."""

    config_class = TinyLMConfig

    def __init__(self, config: TinyLMConfig) -> None:
        super().__init__(config)
        d = config.hidden_size
        self.embed = torch.nn.Embedding(config.vocab_size, d)
        self.conv = torch.nn.Conv1d(d, d, kernel_size=config.window)
        self.mix = torch.nn.Linear(d, d)
        self.phase = torch.nn.Linear(d, d)
        self.window = config.window
        self.post_init()

    def _init_weights(self, module: torch.nn.Module) -> None:
        pass  # torch's own initialisation (transformers' would shrink the embeddings to std 0.02)

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.embed

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                **kwargs) -> BaseModelOutput:
        mask = torch.ones_like(input_ids, dtype=torch.float32) if attention_mask is None else attention_mask.float()
        x = self.embed(input_ids) * mask[..., None]  # (B, T, d); padding embeds as zeros
        local = self.conv(torch.nn.functional.pad(x.transpose(1, 2), (self.window - 1, 0))).transpose(1, 2)
        count = torch.cumsum(mask, dim=1).clamp(min=1.0)[..., None]
        total = torch.cumsum(x, dim=1)
        hidden = local + self.mix(total / count) + self.phase(torch.sin(total))
        return BaseModelOutput(last_hidden_state=torch.tanh(hidden))


class TinyLM(PreTrainedModel, GenerationMixin):
    """The causal LM: backbone (``self.model``) + LM head with bias (``generate`` works too,
    recomputing the whole prefix per token: fine for tests, not for long outputs)."""

    config_class = TinyLMConfig
    base_model_prefix = "model"

    def __init__(self, config: TinyLMConfig) -> None:
        super().__init__(config)
        self.model = TinyLMBackbone(config)
        self.lm_head = torch.nn.Linear(config.hidden_size, config.vocab_size)
        self.post_init()

    def _init_weights(self, module: torch.nn.Module) -> None:
        # transformers re-initialises weights on load unless told how: keep torch's defaults
        # (from_pretrained overwrites them with the checkpoint's anyway).
        pass

    def get_output_embeddings(self) -> torch.nn.Linear:
        return self.lm_head

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.model.embed

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                logits_to_keep: int = 0, **kwargs) -> CausalLMOutput:
        hidden = self.model(input_ids, attention_mask).last_hidden_state
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        return CausalLMOutput(logits=self.lm_head(hidden))


def new_model(vocab_size: int, *, hidden_size: int = 32, window: int = 8, seed: int = 0, head_scale: float = 4.0,
              pad_token_id: int | None = None, eos_token_id: int | None = None) -> TinyLM:
    """A freshly initialised model (seeded: the same weights on every machine). The
    head's weights are scaled up by ``head_scale`` so that, like a real LM's, its
    logprobs differ by nats from token to token and context to context (torch's default
    init predicts an almost uniform distribution: a misaligned token would barely show)."""
    torch.manual_seed(seed)
    model = TinyLM(TinyLMConfig(vocab_size=vocab_size, hidden_size=hidden_size, window=window,
                                pad_token_id=pad_token_id, eos_token_id=eos_token_id))
    with torch.no_grad():
        model.lm_head.weight.mul_(head_scale)
    return model


def load_model(path: str | Path) -> TinyLM:
    """A checkpoint written by :func:`save_model`, in eval mode (``TinyLM.from_pretrained``
    reads it too; this skips its progress bars and re-initialisation)."""
    root = Path(path)
    model = TinyLM(TinyLMConfig.from_pretrained(str(root)))
    model.load_state_dict(load_file(str(root / WEIGHTS)))
    model.eval()
    return model


def save_model(model: TinyLM, path: str | Path) -> Path:
    """``config.json`` + ``model.safetensors`` in the directory ``path`` (SGLang's
    ``model_path`` is a directory too), written under temporary names and renamed, so a
    worker loading it never reads half a file."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{WEIGHTS}.tmp"
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(tmp))
    model.config.save_pretrained(str(root))
    tmp.replace(root / WEIGHTS)
    return root


def token_logprobs(model: TinyLM, tokens: Sequence[int] | torch.Tensor, positions: Sequence[int] | torch.Tensor,
                   temperature: float = 1.0) -> torch.Tensor:
    """``log p(tokens[i] | tokens[:i])`` for each ``i`` in ``positions`` (each >= 1), from
    the logits divided by ``temperature`` (SGLang's logprobs of a sampled request; a
    greedy request, temperature ~0, reports the model's own, temperature 1).

    Differentiable: the trainer calls it under autograd, the worker under ``inference_mode``."""
    ids = torch.as_tensor(tokens, dtype=torch.long)
    pos = torch.as_tensor(positions, dtype=torch.long)
    if len(pos) == 0:
        return torch.zeros(0)
    end = int(pos.max())  # later tokens cannot change these positions (causal): leave them out
    hidden = model.model(ids[None, :end]).last_hidden_state[0]
    logits = model.lm_head(hidden[pos - 1])
    t = temperature if temperature >= GREEDY_BELOW else 1.0
    return torch.log_softmax(logits / t, dim=-1).gather(1, ids[pos][:, None])[:, 0]


def next_token_logits(model: TinyLM, tokens: Sequence[int]) -> torch.Tensor:
    """The logits of the token after ``tokens`` (a 1-D tensor over the vocabulary)."""
    ids = torch.as_tensor(tokens, dtype=torch.long)
    return model.lm_head(model.model(ids[None]).last_hidden_state[0, -1])


def sample_token(logits: torch.Tensor, generator: torch.Generator, *, temperature: float = 1.0,
                 top_p: float = 1.0, top_k: int = -1, min_p: float = 0.0) -> int:
    """One token as SGLang samples it: greedy below ``GREEDY_BELOW``, else softmax of
    ``logits / temperature`` cut by top-k, top-p and min-p."""
    if temperature < GREEDY_BELOW:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_k > 0:
        kth = torch.topk(probs, min(top_k, probs.numel())).values[-1]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        drop = torch.cumsum(sorted_p, 0) - sorted_p > top_p  # keep the smallest set reaching top_p
        probs = probs.scatter(0, order[drop], 0.0)
    if min_p > 0.0:
        probs = torch.where(probs >= min_p * probs.max(), probs, torch.zeros_like(probs))
    return int(torch.multinomial(probs / probs.sum(), 1, generator=generator))


class LMScorer:
    """The scripted worker's model (``farm engine serve --model PATH``): one loaded
    checkpoint, never mutated (a weight update loads a new scorer and the worker swaps
    it in, so a request in flight finishes on the weights it started with).

    Satisfies ``farm.simulator.scoring.Scorer``."""

    def __init__(self, model: TinyLM, path: str) -> None:
        self.model = model
        self.path = path
        self.vocab_size = int(model.config.vocab_size)

    @classmethod
    def from_path(cls, path: str | Path, *, threads: int | None = None) -> "LMScorer":
        """Load ``path``; ``threads`` caps torch's intra-op threads in this process
        (several workers share the cores)."""
        if threads:
            torch.set_num_threads(threads)
        root = Path(path)
        if not (root / WEIGHTS).is_file() or not (root / "config.json").is_file():
            raise ValueError(f"{path} is not a farm tiny-LM checkpoint (config.json + {WEIGHTS})")
        return cls(load_model(root), str(path))

    def load(self, path: str) -> "LMScorer":
        new = LMScorer.from_path(path)
        if new.vocab_size != self.vocab_size:
            raise ValueError(f"checkpoint {path} has vocabulary {new.vocab_size}, the served model {self.vocab_size}")
        return new

    def logprobs(self, input_ids: Sequence[int], output_ids: Sequence[int], temperature: float) -> list[float]:
        n = len(input_ids)
        with torch.inference_mode():
            return token_logprobs(self.model, [*input_ids, *output_ids], range(n, n + len(output_ids)),
                                  temperature).tolist()

    def sample(self, ids: Sequence[int], sampling, seed: int) -> int:
        """``sampling``: SGLang's sampling parameters (temperature, top_p, top_k, min_p)."""
        generator = torch.Generator().manual_seed(seed)
        with torch.inference_mode():
            return sample_token(next_token_logits(self.model, ids), generator, temperature=sampling.temperature,
                                top_p=sampling.top_p, top_k=sampling.top_k, min_p=sampling.min_p)
