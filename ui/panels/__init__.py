"""The panels inside a tab, each a module with its own components and handlers: the contrastive step (`contrast`),
MACS by layer (`layers`), the answer tokens that used a region (`regions`), the sources (`sources`), the image
reliance strip (`reliance`), the faithfulness curves (`faithfulness`, its request read by `measurement`) and the time
estimate line (`estimates`)."""
