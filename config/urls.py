"""URL routes for the web app."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from config.health import healthz
from config.metrics import metrics
from credits.apis import CreditsApi
from orders.apis import OrderDetailApi, OrderListCreateApi, TransactionCheckApi

urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics, name="metrics"),
    path("api/orders/", OrderListCreateApi.as_view(), name="order-list"),
    path("api/orders/<int:order_id>/", OrderDetailApi.as_view(), name="order-detail"),
    path("api/transactions/<str:transaction_id>/", TransactionCheckApi.as_view(), name="transaction-check"),
    path("api/credits/", CreditsApi.as_view(), name="credits"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    path("api/redoc/", SpectacularRedocView.as_view(url_name="schema"), name="redoc"),
    path("reports/", include("analytics.urls")),
]

# Unknown URLs under /api/ answer JSON like the API's own 404s (the OpenAPI document promises JSON).
handler404 = "config.api.not_found"
