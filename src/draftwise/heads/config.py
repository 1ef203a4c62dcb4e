"""`HeadArch`: everything that fixes the parameter shapes of a head set (docs/training.md, the
recipe keys), read by every head module (`heads.arch`, `heads.clover`), the artifact format and
training."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from draftwise.errors import InputError

FAMILIES = ("medusa", "hydra", "hydra++", "clover")
DEPENDENT = ("hydra", "hydra++", "clover")  # heads that read their path's token embeddings
CONTEXT_LAYER = ("hydra++", "clover")  # families with an optional layer over the whole context (`prefix`)


@dataclass(frozen=True)
class HeadArch:
    """Everything that fixes the parameter shapes of a head set."""

    family: str  # "medusa" (independent), "hydra", "hydra++" or "clover" (dependent)
    num_heads: int  # K: depths 1..K past the pending token
    hidden_size: int  # d of the target
    layers: int  # residual blocks per head (Hydra: after its input projection)
    vocab_size: int  # the target's vocabulary V
    draft_vocab: int  # rows of the draft vocabulary (== vocab_size: the full LM head)
    own_lm_head: bool = False  # Medusa only: each head ends in its own [V_d, d] LM head, not the target's
    # hydra++: the prefix-attention decoder layer over the context feeds the heads; clover: the
    # augmenting block on the target state (the same layer as Hydra++'s)
    prefix: bool = False

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise InputError(f"head family must be one of {FAMILIES}, got {self.family!r}")
        if self.own_lm_head and self.family != "medusa":
            raise InputError(f"own LM heads are a Medusa layout; {self.family} heads share the target's")
        if self.prefix and self.family not in CONTEXT_LAYER:
            raise InputError(f"a context layer (prefix) is a {' / '.join(CONTEXT_LAYER)} option, not {self.family}'s")
        if self.num_heads < 1 or self.layers < 1:
            raise InputError(f"a head set needs >= 1 head and >= 1 layer, got {self.num_heads} and {self.layers}")
        if not 0 < self.draft_vocab <= self.vocab_size:
            raise InputError(f"draft vocabulary of {self.draft_vocab} rows for a vocabulary of {self.vocab_size}")

    @property
    def dependent(self) -> bool:
        return self.family in DEPENDENT

    def as_dict(self) -> dict:
        """own_lm_head and prefix only when set: an older set keeps the dict (and the hashes) it had."""
        return {k: v for k, v in asdict(self).items() if k not in ("own_lm_head", "prefix") or v}
