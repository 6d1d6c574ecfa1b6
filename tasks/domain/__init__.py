"""Tenure's domain work: the real import, render, ASR, notification and write-gate logic.

Pure modules the actors in ``tasks`` call: they take explicit arguments, report progress through a
``progress(fraction, message)`` callback, check cancellation through a ``should_stop()`` callback
(raising :class:`~tasks.domain.control.Cancelled`), and never download anything at run time. Nothing
here imports Dramatiq, the broker or the job layer, so every module is testable on plain files.

Subpackages: ``recording`` (scan/probe/danmaku import), ``media`` (ffmpeg runner, render, subtitles),
``asr`` (faster-whisper transcription), ``notify`` (webhooks, email, circuit breaker); modules
``write_gate`` (output-root health) and ``demo_recording`` (synthetic recordings for demos and tests).
"""
