"""The page's two tabs, a text prompt (`text_tab`) and an image with a question (`image_tab`), with the examples
they offer (`examples`) and the text tab's first view and share links (`share`)."""
