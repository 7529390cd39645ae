"""One session: its life as data, its drivers, its output and input, its ring."""
