"""The page's two tabs, a text prompt (`text`) and an image with a question (`image`), with the examples they offer
(`examples`) and the text tab's first view and share links (`share`)."""
