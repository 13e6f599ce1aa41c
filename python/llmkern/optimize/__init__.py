"""Configuration sweeps (`llmkern optimize`), the performance estimate (`llmkern estimate`) and the
SQLite runs database both write (db.py), which `llmkern explore` reads."""
