"""Memory model: per-token/per-request sizes (`sizes`), parameter counts (`params`), per-GPU plans (`plan`)."""
