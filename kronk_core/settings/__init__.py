"""Settings: the core's configuration keys, the manual's spellings, plugins'
sections, and where model files are.
"""
