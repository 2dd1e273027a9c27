"""Sweeps of many DP-SGD configurations: configurations, planning, bucket programs, storage, driver."""
