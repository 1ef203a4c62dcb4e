"""Medusa: K independent heads over the target's frontier state (docs/drafters.md, "Draft heads")."""

from draftwise.proposers.heads import family

FAMILY = family("medusa", "trained independent heads read the target's own last hidden state (one stage per round)")
