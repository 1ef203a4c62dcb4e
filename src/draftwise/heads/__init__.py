"""Draft heads: small trained modules that read the target's own last hidden state (and, for
dependent heads, the embeddings of the tokens drafted before them) and predict the tokens
past the frontier.  `arch` holds the modules, `artifact` their on-disk form, `interchange`
the layouts other projects use."""
