"""Entry point. Until the Hydra app lands, a demo of the pipeline on the tiny offline model."""

from __future__ import annotations

import logging


def main() -> None:
    from steer_hydra.controls.input import SystemPrompt
    from steer_hydra.controls.output import StoppingRules
    from steer_hydra.core import SteeringPipeline
    from steer_hydra.models import TINY_REF

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    controls = [SystemPrompt(text="Answer briefly."), StoppingRules(budget=24)]
    with SteeringPipeline(TINY_REF, controls=controls, device="cpu") as pipeline:
        pipeline.steer()
        chats = [[{"role": "user", "content": "What is the capital of France?"}], [{"role": "user", "content": "Hi"}]]
        for chat, output in zip(chats, pipeline.generate(messages=chats, return_output=True), strict=True):
            print(f"{chat[-1]['content']!r} -> {output.decode(pipeline.tokenizer)[0]!r} ({output.finish_reason})")


if __name__ == "__main__":
    main()
