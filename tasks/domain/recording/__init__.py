"""Import a live-stream recording folder: segment names, true durations, danmaku XML."""
