"""Small bar charts as inline SVG, drawn by the server: no script, no CDN, nothing the page's CSP must allow."""

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

WIDTH, HEIGHT, TOP = 360, 72, 14


def bar_chart(values: list[int], *, title: str) -> SafeString:
    """Return an SVG element with one bar per value (oldest left), its title and the highest value as a scale."""
    peak = max(values, default=0)
    step = WIDTH / max(len(values), 1)
    bars = format_html_join(
        "",
        '<rect x="{}" y="{}" width="{}" height="{}"><title>{} min ago: {}</title></rect>',
        (
            (
                f"{i * step:.1f}",
                f"{HEIGHT - height:.1f}",
                f"{max(step - 1, 1):.1f}",
                f"{height:.1f}",
                len(values) - 1 - i,
                value,
            )
            for i, value in enumerate(values)
            for height in [(HEIGHT - TOP) * value / peak if peak else 0.0]
        ),
    )
    return format_html(
        '<svg class="sparkline" role="img" aria-label="{title}" viewBox="0 0 {w} {h}" width="{w}" height="{h}">'
        '<text x="0" y="10">{title} (max {peak}/min)</text>'
        '<line x1="0" y1="{h}" x2="{w}" y2="{h}"></line><g>{bars}</g></svg>',
        title=title,
        w=WIDTH,
        h=HEIGHT,
        peak=peak,
        bars=bars,
    )
