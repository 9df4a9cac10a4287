"""The pre-registered Keyformer-vs-H2O experiment (docs/traces.md, "Pre-registered experiment"): its XSum
teacher-forcing subset (`subset`), its statistics (`analysis`, torch-free) and its capture script
(`run.sh`, two workers, resumable from shards)."""
