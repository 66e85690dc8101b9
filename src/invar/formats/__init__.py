"""The files the core and the workers both read: the model's tokenizer and chat template (`tokenizer`, `chat`) and
the adapter checkpoint format (`checkpoint`). Workers import these modules one by one, so this package's own
`__init__` imports nothing: a worker's code digest then holds only the formats it reads."""
