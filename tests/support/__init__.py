"""What the tests share: harnesses, fixtures, fakes and the helpers for processes and polling."""
