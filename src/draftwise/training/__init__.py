"""Training what the drafters read: the corpus of conversations, the cached hidden states of
the frozen target, the teacher-forcing rows and the head training loop (`draftwise heads train`)."""
