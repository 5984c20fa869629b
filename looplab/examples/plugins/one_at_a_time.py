"""A decoder plugin: each prompt decoded alone by the step decoder, one after another (no padding, no row
shares a matmul with another). Slower than ``step`` on a batch, and the per-request reference a batched
decoder is compared with; greedy tokens equal ``step``'s (``--decoder one_at_a_time``)."""

from dataclasses import dataclass

from looplab.generation.decoders import DecodingMethod, register_decoder
from looplab.generation.sampling import Generation
from looplab.generation.step import Decoder
from looplab.params import param


@dataclass
class OneAtATimeParams:
    reverse: bool = param(False, None, "decode the last prompt first")


@register_decoder
class OneAtATime(DecodingMethod):
    name = "one_at_a_time"
    Params = OneAtATimeParams

    def decode(self, model, prompts, max_new_tokens, options, finished, forced) -> Generation:
        out = Generation(*([[] for _ in prompts] for _ in range(3)))
        order = range(len(prompts) - 1, -1, -1) if options.decoder_params.reverse else range(len(prompts))
        for row in order:
            alone = [forced[row]] if forced is not None else None
            one = Decoder(model, [prompts[row]], max_new_tokens, options, finished, alone).run()
            out.tokens[row], out.depths[row], out.logprobs[row] = one.tokens[0], one.depths[0], one.logprobs[0]
            out.cache_bytes = max(out.cache_bytes, one.cache_bytes)
        return out
