"""draftwise: exact speculative decoding, chosen by measured time per committed token."""

__version__ = "0.1.0"
