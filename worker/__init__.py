"""The runnable side of Mission Conductor: worker, CLI, connection and the embedded stack."""
