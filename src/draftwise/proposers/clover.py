"""Clover: a recurrent draft state advanced by a regressive attention step per drafted token,
the target's LM head at every depth (docs/drafters.md, "Draft heads")."""

from draftwise.proposers.heads import family

FAMILY = family("clover", "a recurrent draft state over the target's state and the path's tokens, the target's "
                          "LM head at every depth (a stage per level)")
