"""HetPipe: virtual workers and the WSP timeline, simulated and emulated (:mod:`.virtual_workers`)."""
