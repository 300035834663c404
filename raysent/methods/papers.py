"""The papers the methods implement: arXiv id and BibTeX entry of each, one place for all methods
(``Method.arxiv`` and ``Method.citation``; ``raysent methods`` prints them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Paper:
    arxiv: str
    citation: str


SIMCSE = Paper("2104.08821", """@inproceedings{gao2021simcse,
  title = {{SimCSE}: Simple Contrastive Learning of Sentence Embeddings},
  author = {Gao, Tianyu and Yao, Xingcheng and Chen, Danqi},
  booktitle = {Proceedings of the 2021 Conference on Empirical Methods in Natural Language Processing},
  year = {2021},
  eprint = {2104.08821},
  archivePrefix = {arXiv}
}""")

SELF_GUIDED = Paper("2106.07345", """@inproceedings{kim2021selfguided,
  title = {Self-Guided Contrastive Learning for {BERT} Sentence Representations},
  author = {Kim, Taeuk and Yoo, Kang Min and Lee, Sang-goo},
  booktitle = {Proceedings of the 59th Annual Meeting of the Association for Computational Linguistics},
  year = {2021},
  eprint = {2106.07345},
  archivePrefix = {arXiv}
}""")

CONSERT = Paper("2105.11741", """@inproceedings{yan2021consert,
  title = {{ConSERT}: A Contrastive Framework for Self-Supervised Sentence Representation Transfer},
  author = {Yan, Yuanmeng and Li, Rumei and Wang, Sirui and Zhang, Fuzheng and Wu, Wei and Xu, Weiran},
  booktitle = {Proceedings of the 59th Annual Meeting of the Association for Computational Linguistics},
  year = {2021},
  eprint = {2105.11741},
  archivePrefix = {arXiv}
}""")

LAYERATT = Paper("2209.05972", """@inproceedings{oh2022layeratt,
  title = {Don't Judge a Language Model by Its Last Layer: Contrastive Learning with Layer-Wise Attention
           Pooling},
  author = {Oh, Dongsuk and Kim, Yejin and Lee, Hodong and Huang, H. Howie and Lim, Heuiseok},
  booktitle = {Proceedings of the 29th International Conference on Computational Linguistics},
  year = {2022},
  eprint = {2209.05972},
  archivePrefix = {arXiv}
}""")

SUPCON = Paper("2106.04791", """@misc{liao2021supcon,
  title = {Sentence Embeddings using Supervised Contrastive Learning},
  author = {Liao, Danqi},
  year = {2021},
  eprint = {2106.04791},
  archivePrefix = {arXiv}
}""")

SBERT = Paper("1908.10084", """@inproceedings{reimers2019sbert,
  title = {Sentence-{BERT}: Sentence Embeddings using Siamese {BERT}-Networks},
  author = {Reimers, Nils and Gurevych, Iryna},
  booktitle = {Proceedings of the 2019 Conference on Empirical Methods in Natural Language Processing},
  year = {2019},
  eprint = {1908.10084},
  archivePrefix = {arXiv}
}""")
