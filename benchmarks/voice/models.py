"""The workloads: models built from `transformers` configs with random weights (nothing is
downloaded), fp16 on the GPU, each with one fixed-size request. torch and transformers are
imported inside the builders, so the harness's pure parts load without them.

A builder takes config overrides ({"decoder_layers": 4}) and a device and returns
(request, description): `request()` runs one request to completion (synchronized)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

Request = Callable[[], None]
Builder = Callable[[dict[str, Any], str], tuple[Request, str]]


def _sync(device: str) -> Callable[[], None]:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.synchronize
    return lambda: None


def _dtype(device: str) -> Any:
    import torch

    return torch.float16 if device.startswith("cuda") else torch.float32


def _build(model_class: Any, config: Any, device: str, **kwargs: Any) -> tuple[Any, Any]:
    """The model with random weights, built on the device in its dtype, in eval mode; and a
    seeded generator for the request's fixed random input."""
    import torch

    with torch.device(device):
        model = model_class(config, **kwargs).to(_dtype(device)).eval()
    return model, torch.Generator(device=device).manual_seed(0)


def asr(overrides: dict[str, Any], device: str) -> tuple[Request, str]:
    """Whisper-small-shaped ASR: 30 s of audio (80 mel bins x 3000 frames) through the encoder,
    then 12 greedy decoder steps with a KV cache (what generate does, minus its bookkeeping)."""
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    settings: dict[str, Any] = {
        "d_model": 768,
        "encoder_layers": 12,
        "decoder_layers": 12,
        "encoder_attention_heads": 12,
        "decoder_attention_heads": 12,
        "encoder_ffn_dim": 3072,
        "decoder_ffn_dim": 3072,
        "num_mel_bins": 80,
        "tokens": 12,
    }
    settings.update(overrides)
    tokens = int(settings.pop("tokens"))
    config = WhisperConfig(**settings)
    model, gen = _build(WhisperForConditionalGeneration, config, device)
    features = torch.randn(
        1, config.num_mel_bins, 2 * config.max_source_positions, generator=gen, device=device
    ).to(_dtype(device))
    start = torch.tensor([[config.decoder_start_token_id]], device=device)
    sync = _sync(device)

    @torch.inference_mode()
    def request() -> None:
        encoded = model.model.encoder(features)
        ids, past = start, None
        for _ in range(tokens):
            out = model(
                encoder_outputs=encoded, decoder_input_ids=ids, past_key_values=past, use_cache=True
            )
            past = out.past_key_values
            ids = out.logits[:, -1:].argmax(-1)
        ids.cpu()  # the token ids leave the GPU, as a server returns them
        sync()

    return request, (
        f"Whisper-shaped ASR (d_model {config.d_model}, {config.encoder_layers}+"
        f"{config.decoder_layers} layers), {2 * config.max_source_positions} mel frames,"
        f" {tokens} greedy tokens"
    )


def tts(overrides: dict[str, Any], device: str) -> tuple[Request, str]:
    """VITS TTS (VitsConfig defaults) on 120 characters. The duration noise is off so every
    request makes the same length of audio (random weights decide how long)."""
    import torch
    from transformers import VitsConfig, VitsModel

    settings: dict[str, Any] = {"noise_scale_duration": 0.0, "characters": 120}
    settings.update(overrides)
    characters = int(settings.pop("characters"))
    config = VitsConfig(**settings)
    model, gen = _build(VitsModel, config, device)
    ids = torch.randint(1, config.vocab_size, (1, characters), generator=gen, device=device)
    sync = _sync(device)
    with torch.inference_mode():
        samples = model(input_ids=ids).waveform.shape[-1]

    @torch.inference_mode()
    def request() -> None:
        model(input_ids=ids).waveform.cpu()
        sync()

    return request, (
        f"VITS TTS (VitsConfig defaults), {characters} characters ->"
        f" {samples / config.sampling_rate:.1f} s of audio"
    )


def embed(overrides: dict[str, Any], device: str) -> tuple[Request, str]:
    """BERT-base embeddings of a batch of 16 x 256 tokens (mean-pooled)."""
    import torch
    from transformers import BertConfig, BertModel

    settings: dict[str, Any] = {"batch": 16, "sequence": 256}
    settings.update(overrides)
    batch, sequence = int(settings.pop("batch")), int(settings.pop("sequence"))
    config = BertConfig(**settings)
    model, gen = _build(BertModel, config, device, add_pooling_layer=False)
    ids = torch.randint(0, config.vocab_size, (batch, sequence), generator=gen, device=device)
    sync = _sync(device)

    @torch.inference_mode()
    def request() -> None:
        model(input_ids=ids).last_hidden_state.mean(1).cpu()
        sync()

    return request, (
        f"BERT-base embeddings ({config.num_hidden_layers} layers, hidden"
        f" {config.hidden_size}), {batch}x{sequence} tokens"
    )


def hog(overrides: dict[str, Any], device: str) -> tuple[Request, str]:
    """The misbehaving tenant: a BERT-base batch job (64 x 512 tokens) run in an unbounded loop
    by the worker, never waiting for anyone."""
    settings = {"batch": 64, "sequence": 512}
    settings.update(overrides)
    request, _ = embed(settings, device)
    return request, f"batch job: BERT-base {settings['batch']}x{settings['sequence']} in a loop"


def fake(overrides: dict[str, Any], device: str) -> tuple[Request, str]:
    """No model: a request sleeps `service_ms` (CPU smoke tests of the harness)."""
    service = float(overrides.get("service_ms", 2.0)) / 1e3

    def request() -> None:
        time.sleep(service)

    return request, f"fake model ({service * 1e3:g} ms sleep)"


BUILDERS: dict[str, Builder] = {"asr": asr, "tts": tts, "embed": embed, "hog": hog, "fake": fake}
