"""Routes of the staff report pages (mounted under /reports/)."""

from django.urls import path

from analytics import views

app_name = "analytics"
urlpatterns = [
    path("", views.run_list, name="run-list"),
    path("runs/<int:run_id>/", views.run_detail, name="run-detail"),
    path("<str:day>/", views.report_file, name="report"),
    path("<str:day>/<str:name>", views.report_file, name="report-file"),
]
