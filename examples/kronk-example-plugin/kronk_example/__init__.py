"""An example third-party Kronk plugin, installed and tested like a built-in."""
