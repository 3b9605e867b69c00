"""Vision RL, pure parts: the rollout server's image limits and image capture, the trainer's sequences carrying
their images, and the trainer's refusal of image URLs it must not load or pad tokens that do not match."""

from __future__ import annotations

import pytest
import torch
from posttrain_rollout.captures import entries_from_response
from posttrain_rollout.vision import ImageLimits, apply_limits, request_images
from posttrain_trainer.rl_vision import VisionInputError, image_inputs, load_image, pad_tokens_per_image
from posttrain_trainer.rollouts import build_sequences


def img(name: str) -> dict:
    return {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{name}"}}


def text(value: str) -> dict:
    return {"type": "text", "text": value}


def conversation() -> list[dict]:
    return [
        {"role": "system", "content": "Look."},
        {"role": "user", "content": [img("a"), img("b"), text("frame 1")]},
        {"role": "assistant", "content": "ok"},
        {
            "role": "user",
            "content": [img("c"), text("frame 2"), {"type": "input_image", "image_url": "data:d"}],
        },
    ]


def urls(messages) -> list[str]:
    return request_images({"messages": messages})


def test_request_images_in_prompt_order():
    assert urls(conversation()) == [
        "data:image/png;base64,a",
        "data:image/png;base64,b",
        "data:image/png;base64,c",
        "data:d",
    ]
    assert request_images({"messages": "nope"}) == [] and request_images({}) == []


def test_max_images_per_step_drops_the_oldest_first():
    original = conversation()
    out, dropped = apply_limits(original, ImageLimits(max_images_per_step=2))
    assert dropped == 2 and urls(out) == ["data:image/png;base64,c", "data:d"]
    assert out[1]["content"] == [text("frame 1")]  # the text of the trimmed turn stays
    assert urls(original)[0].endswith("a")  # the caller's messages are not modified


def test_max_images_per_message_keeps_the_first_of_each_message():
    out, dropped = apply_limits(conversation(), ImageLimits(max_images_per_message=1))
    assert dropped == 2 and urls(out) == ["data:image/png;base64,a", "data:image/png;base64,c"]


def test_image_only_mode_drops_text_of_user_turns_with_images():
    out, dropped = apply_limits(conversation(), ImageLimits(image_only_mode=True))
    assert dropped == 0 and out[1]["content"] == [img("a"), img("b")]
    assert out[0]["content"] == "Look." and out[2]["content"] == "ok"


def test_no_limits_is_identity():
    messages = conversation()
    assert apply_limits(messages, ImageLimits()) == (messages, 0)


def test_captures_hold_the_images_vllm_was_given():
    body = {
        "prompt_token_ids": [1, 5, 5, 2],
        "choices": [{"index": 0, "token_ids": [7], "logprobs": {"content": [{"logprob": -1.0}]}}],
    }
    (entry,) = entries_from_response(body, chat=True, weight_version=3, images=["data:x"])
    assert entry["images"] == ["data:x"] and entry["prompt_token_ids"] == [1, 5, 5, 2]
    (plain,) = entries_from_response(body, chat=True, weight_version=3)
    assert "images" not in plain


def test_sequences_keep_the_images_of_their_latest_call():
    first = {"prompt_token_ids": [1, 5, 2], "completion_token_ids": [8], "logprobs": [-1.0], "images": ["a"]}
    second = {
        "prompt_token_ids": [1, 5, 2, 8, 3, 5, 2],
        "completion_token_ids": [9],
        "logprobs": [-2.0],
        "images": ["a", "b"],
    }
    (seq,) = build_sequences([first, second])
    assert seq.images == ["a", "b"] and seq.completion_mask == [1, 0, 0, 0, 1]
    trimmed = {**second, "prompt_token_ids": [1, 2, 8, 3, 5, 2], "images": ["b"]}  # oldest image dropped
    seqs = build_sequences([first, trimmed])
    assert [s.images for s in seqs] == [["a"], ["b"]]


@pytest.mark.parametrize(
    "url",
    ["/etc/passwd", "file:///etc/passwd", "relative.png", "http://169.254.169.254/x.png", "https://x/y"],
)
def test_trainer_loads_no_local_path_and_fetches_nothing(url):
    with pytest.raises(VisionInputError, match="data: URIs only"):
        load_image(url)


class _ImageProcessor:
    merge_size = 2

    def __call__(self, images, return_tensors):
        grid = torch.tensor([[1, 4, 4]] * len(images))  # 16 patches -> 4 pad tokens each
        return {"pixel_values": torch.zeros(16 * len(images), 8), "image_grid_thw": grid}


class _Processor:
    image_token_id = 5
    image_processor = _ImageProcessor()


PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElF"
    "TkSuQmCC"
)


def test_image_inputs_check_pad_tokens_against_the_images():
    ids = torch.tensor([[1, 5, 5, 5, 5, 2], [1, 2, 3, 4, 0, 0]])
    out = image_inputs(_Processor(), [[PNG], []], ids)
    assert out["image_grid_thw"].tolist() == [[1, 4, 4]] and out["pixel_values"].shape[0] == 16
    assert out["mm_token_type_ids"].tolist()[0] == [0, 1, 1, 1, 1, 0]
    assert image_inputs(_Processor(), [[], []], ids) == {}
    with pytest.raises(VisionInputError, match="4 image pad tokens in vLLM's prompt, but its 2 image"):
        image_inputs(_Processor(), [[PNG, PNG], []], ids)
    with pytest.raises(VisionInputError, match="no image was captured"):
        image_inputs(_Processor(), [[], [PNG]], torch.tensor([[1, 5, 5, 5, 5, 2], [1, 5, 5, 5, 5, 2]]))


def test_pad_tokens_per_image():
    assert pad_tokens_per_image(torch.tensor([[1, 4, 4], [1, 4, 8]]), 2) == [4, 8]


def test_remote_images_are_inlined_as_data_uris():
    import asyncio

    from posttrain_rollout.vision import ImageFetchError, inline_remote_images

    fetched: list[str] = []

    async def fetch(url: str) -> tuple[str, bytes]:
        fetched.append(url)
        return ("image/png", b"PNG") if url.endswith(".png") else ("text/html", b"<html>")

    messages = [
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": "https://x/a.png"}}, text("hi")],
        },
        {"role": "user", "content": [img("b")]},
        {"role": "assistant", "content": "ok"},
    ]
    out = asyncio.run(inline_remote_images(messages, fetch))
    assert fetched == ["https://x/a.png"]
    assert urls(out) == ["data:image/png;base64,UE5H", "data:image/png;base64,b"]
    assert out[0]["content"][1] == text("hi") and out[1:] == messages[1:]
    assert urls(messages)[0] == "https://x/a.png"  # the caller's messages are not modified
    bad = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/page"}}]}]
    with pytest.raises(ImageFetchError, match="text/html, not an image"):
        asyncio.run(inline_remote_images(bad, fetch))


def test_a_text_only_policy_refuses_image_rollouts():
    from posttrain_trainer.rl import TrainSeq, _collate

    seq = TrainSeq([1, 5, 2], [7], [1], 1.0, images=[PNG])
    with pytest.raises(VisionInputError, match="the policy is text-only"):
        _collate([seq], 0, None)
    assert _collate([TrainSeq([1, 2], [7], [1], 1.0)], 0, None).model_inputs == {}


def test_sequences_whose_policy_sampled_a_pad_token_are_left_out():
    from posttrain_trainer.rl import TrainSeq
    from posttrain_trainer.rl_vision import drop_sampled_media_tokens

    sampled_pad = TrainSeq([1, 5, 2], [7, 5], [1, 1], 1.0)  # the policy itself sampled token 5
    glue_pad = TrainSeq([1, 5, 2], [7, 3, 5, 2, 8], [1, 0, 0, 0, 1], 1.0)  # a later turn's real image
    kept, dropped = drop_sampled_media_tokens([sampled_pad, glue_pad], {5, 6})
    assert kept == [glue_pad] and dropped == 1
