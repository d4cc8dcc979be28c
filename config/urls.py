"""URL routes for the web app."""

from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path, re_path
from django.utils.functional import lazy
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from analytics.views import pipeline
from core.api import api_not_found
from core.api_docs import OfflineRedocView, redoc_bundle
from core.health import healthz
from core.metrics import metrics
from credits.apis import CreditsApi
from orders.apis import OrderDetailApi, OrderListCreateApi, TransactionCheckApi

# The outbox and dead-letter lists are wide tables: the page's width goes to them, not to a sidebar of every model.
admin.site.enable_nav_sidebar = False
admin.site.site_header = "creditshop administration"
admin.site.site_title = "creditshop admin"
# The index links the staff pages that are not model lists: the pipeline at a glance and the nightly reports.
admin.site.index_template = "admin/creditshop_index.html"

urlpatterns = [
    path("admin/pipeline/", pipeline, name="pipeline"),
    path("admin/", admin.site.urls),
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics, name="metrics"),
    path("api/orders/", OrderListCreateApi.as_view(), name="order-list"),
    path("api/orders/<int:order_id>/", OrderDetailApi.as_view(), name="order-detail"),
    path("api/transactions/<str:transaction_id>/", TransactionCheckApi.as_view(), name="transaction-check"),
    path("api/credits/", CreditsApi.as_view(), name="credits"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    path("api/redoc/", OfflineRedocView.as_view(url_name="schema"), name="redoc"),
    path("api/redoc/redoc.standalone.js", redoc_bundle, name="redoc-bundle"),
    # Last under api/: whatever no route above matches answers the API's JSON 404, never an HTML page.
    re_path(r"^api/", api_not_found, name="api-not-found"),
    path("reports/", include("analytics.urls")),
    # Browsers ask every site for /favicon.ico; the admin pages name none. Lazy: the manifest is read per request.
    path("favicon.ico", RedirectView.as_view(url=lazy(static, str)("favicon.svg"), permanent=False)),
]

# Unknown URLs under /api/ answer JSON like the API's own 404s (the OpenAPI document promises JSON), also when raised
# as Http404 by a view; the api-not-found route above covers DEBUG, where Django shows its own page instead.
handler404 = "core.api.not_found"
