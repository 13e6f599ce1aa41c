"""Bad-input corpora, one module per op family. Each exposes CASES: a list of
(case_id, thunk, expected exception type, substring the message must contain — the argument's name),
and OPS: the names of the ops its cases cover."""
