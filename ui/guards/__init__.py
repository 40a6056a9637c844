"""What every public event passes through, since any event can be called directly (docs/architecture.md): widget
values checked (`inputs`), text from outside escaped (`markup`), only visitors' own uploads opened (`uploads`), and
the library's typed errors turned into `gr.Error` (`errors`)."""
