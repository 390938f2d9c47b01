import torch

from llmkit.model import huge_pages


def test_panels_are_cut_from_huge_page_chunks(monkeypatch):
    """Panels of 64 KB and more come from chunks advised as 2 MB pages (MADV_HUGEPAGE), each slice
    on a 64-byte boundary and apart from the others; a weight of more than half a chunk gets its
    own region; LLMKIT_HUGE_PAGES=0 (or no THP) leaves allocation to torch."""
    advised = []
    monkeypatch.setattr(huge_pages, "_madvise_huge_pages", lambda: lambda at, size, advice: advised.append(
        (at.value, size.value, advice)))
    monkeypatch.setattr(huge_pages, "_ARENA", huge_pages.PanelArena())
    a = huge_pages.panel_storage(100_000, torch.float32)
    b = huge_pages.panel_storage(70_001, torch.int16)
    big = huge_pages.panel_storage(5 << 20, torch.float32)  # 20 MB: more than half of a 32 MB chunk
    small = huge_pages.panel_storage(1000, torch.float32)
    assert [t.dtype for t in (a, b, big)] == [torch.float32, torch.int16, torch.float32] and a.numel() == 100_000
    assert len(advised) == 2 and all(at % (2 << 20) == 0 and size % (2 << 20) == 0 and advice == 14
                                     for at, size, advice in advised)
    chunk = advised[0][0]
    assert a.data_ptr() == chunk and b.data_ptr() == chunk + -(-400_000 // 64) * 64  # the next 64-byte line
    assert advised[1][0] == big.data_ptr() and advised[1][1] >= big.numel() * 4
    assert not chunk <= small.data_ptr() < chunk + (32 << 20)  # small weights: torch's own allocation
    monkeypatch.setattr(huge_pages, "_madvise_huge_pages", lambda: None)
    assert huge_pages.panel_storage(100_000, torch.float32).numel() == 100_000
