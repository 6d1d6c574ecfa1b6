"""Speech recognition with faster-whisper on packaged (offline) models."""
